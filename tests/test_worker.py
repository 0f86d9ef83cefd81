"""The worker's behaviour on the memory broker: outcomes, bad input, pools, stopping."""

from __future__ import annotations

import threading
import time

import pytest

from hurtle import Hurtle, Message, Reject, Retry


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)


def _dead(app: Hurtle, queue: str = "default"):  # type: ignore[no-untyped-def]
    return app.broker.dead_letters(queue)


def test_burst_worker_runs_every_task_then_exits(app: Hurtle) -> None:
    seen: list[int] = []

    @app.task
    def record(i: int) -> None:
        seen.append(i)

    record.send_many([(i,) for i in range(2500)])
    worker = app.worker(burst=True)
    worker.run()
    assert sorted(seen) == list(range(2500))
    assert (
        app.broker.stats(["default"])["default"] == type(app.broker.stats(["default"])["default"])()
    )


def test_worker_without_queues_consumes_every_queue_its_tasks_name(app: Hurtle) -> None:
    seen: list[str] = []

    @app.task(queue="emails")
    def email() -> None:
        seen.append("email")

    @app.task
    def other() -> None:
        seen.append("other")

    email.send()
    other.send()
    other.options(queue="elsewhere").send()
    worker = app.worker(burst=True)
    assert set(worker.queues) == {"emails", "default"}
    worker.run()
    assert sorted(seen) == ["email", "other"]
    assert app.broker.stats(["elsewhere"])["elsewhere"].ready == 1


def test_unknown_task_is_dead_lettered_with_the_reason_and_the_worker_carries_on(
    app: Hurtle,
) -> None:
    ran: list[int] = []

    @app.task
    def known(i: int) -> None:
        ran.append(i)

    ghost = Message(id="m1", task="nowhere.ghost", queue="default", args=(1,))
    app.broker.publish([ghost])
    known.send(2)
    app.worker(burst=True).run()
    assert ran == [2]
    (dead,) = _dead(app)
    assert "unknown task 'nowhere.ghost'" in dead.reason
    assert dead.raw == ghost.encode()


def test_undecodable_bytes_are_dead_lettered_raw_and_the_worker_carries_on(app: Hurtle) -> None:
    ran: list[int] = []

    @app.task
    def known(i: int) -> None:
        ran.append(i)

    app.broker.publish_raw("default", [b"\x00garbage\xff", b"{}"])
    known.send(3)
    app.worker(burst=True).run()
    assert ran == [3]
    dead = _dead(app)
    assert sorted(d.raw for d in dead) == sorted([b"\x00garbage\xff", b"{}"])
    assert all(d.reason.startswith("undecodable message") for d in dead)
    assert all(d.message() is None for d in dead)


def test_failing_task_is_retried_then_dead_lettered_with_its_traceback(app: Hurtle) -> None:
    attempts: list[int] = []

    @app.task(retries=2, retry_delay=0.01)
    def broken(x: int) -> None:
        attempts.append(x)
        raise ValueError(f"bad value {x}")

    broken.send(7)
    app.worker(burst=True).run()
    assert attempts == [7, 7, 7]
    (dead,) = _dead(app)
    assert "failed on attempt 3 of 3" in dead.reason
    assert "Traceback" in dead.reason and "ValueError: bad value 7" in dead.reason
    m = dead.message()
    assert m is not None and m.attempt == 2 and "ValueError" in m.headers["error"]


def test_retried_dead_letter_runs_again_with_a_fresh_retry_budget(app: Hurtle) -> None:
    attempts: list[int] = []
    healthy = threading.Event()

    @app.task(retries=1, retry_delay=0.01)
    def flaky() -> None:
        attempts.append(1)
        if not healthy.is_set():
            raise RuntimeError("down")

    flaky.send()
    app.worker(burst=True).run()
    assert len(attempts) == 2 and len(_dead(app)) == 1
    healthy.set()
    assert app.broker.retry_dead("default") == 1
    app.worker(burst=True).run()
    assert len(attempts) == 3 and _dead(app) == []


def test_task_can_ask_for_a_retry_or_reject_its_message(app: Hurtle) -> None:
    calls: list[str] = []

    @app.task(retries=3)
    def again() -> None:
        calls.append("again")
        if len([c for c in calls if c == "again"]) < 2:
            raise Retry(delay=0.01)

    @app.task
    def refuse() -> None:
        calls.append("refuse")
        raise Reject("not for me")

    again.send()
    refuse.send()
    app.worker(burst=True).run()
    assert calls.count("again") == 2 and calls.count("refuse") == 1
    (dead,) = _dead(app)
    assert "not for me" in dead.reason


def test_async_task_runs_to_completion_in_the_solo_and_threads_pools(app: Hurtle) -> None:
    import asyncio

    done: list[int] = []

    @app.task
    async def slow_add(x: int, y: int) -> None:
        await asyncio.sleep(0)
        done.append(x + y)

    slow_add.send(1, 2)
    app.worker(burst=True).run()
    slow_add.send(3, 4)
    app.worker(burst=True, pool="threads", concurrency=2).run()
    assert done == [3, 7]


def test_threads_pool_runs_tasks_concurrently(app: Hurtle) -> None:
    barrier = threading.Barrier(4, timeout=10)
    ran: list[int] = []

    @app.task
    def meet(i: int) -> None:
        barrier.wait()  # only passes if four run at once
        ran.append(i)

    meet.send_many([(i,) for i in range(8)])
    app.worker(burst=True, pool="threads", concurrency=4).run()
    assert sorted(ran) == list(range(8))


def test_higher_priority_runs_first(app: Hurtle) -> None:
    order: list[int] = []

    @app.task
    def step(p: int) -> None:
        order.append(p)

    for p in (0, 5, 9, 1):
        step.options(priority=p).send(p)
    app.worker(burst=True).run()
    assert order == [9, 5, 1, 0]


def test_delayed_task_runs_after_its_delay(app: Hurtle) -> None:
    ran_at: list[float] = []

    @app.task
    def later() -> None:
        ran_at.append(time.time())

    sent_at = time.time()
    later.options(delay=0.3).send()
    app.worker(burst=True).run()
    assert len(ran_at) == 1 and ran_at[0] >= sent_at + 0.3


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_graceful_stop_finishes_running_task_and_hands_back_the_rest(
    app: Hurtle, pool: str
) -> None:
    started = threading.Event()
    finished: list[int] = []

    @app.task
    def slow(i: int) -> None:
        started.set()
        time.sleep(0.3)
        finished.append(i)

    slow.send_many([(i,) for i in range(20)])
    worker = app.worker(pool=pool, concurrency=1)
    thread = worker.run_in_thread()
    assert started.wait(5)
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert len(finished) >= 1
    stats = app.broker.stats(["default"])["default"]
    assert stats.in_flight == 0
    assert stats.ready == 20 - len(finished)
