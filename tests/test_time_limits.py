"""``@app.task(time_limit=S)``: a task that runs longer is stopped (or, in a thread, abandoned)
and recorded as failed with ``TimeLimitExceeded``, then retried or dead-lettered by its policy."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from hurtle import Hurtle
from test_executors_processes import GREENLET_POOLS, Project, pools, project  # noqa: F401


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)


def test_threads_pool_fails_an_overrunning_task_and_replaces_its_thread(app: Hurtle) -> None:
    stuck = threading.Event()
    quick_ran: list[int] = []

    @app.task(time_limit=0.2, retries=0)
    def hang() -> None:
        stuck.wait(30)  # "blocked in C": nothing can interrupt it

    @app.task
    def quick(i: int) -> None:
        quick_ran.append(i)

    hang.send()
    quick.send_many([(i,) for i in range(5)])
    worker = app.worker(pool="threads", concurrency=1, burst=True)
    started = time.monotonic()
    worker.run()  # the one thread is stuck, yet the others run and the worker exits
    assert time.monotonic() - started < 20
    assert sorted(quick_ran) == list(range(5))
    (dead,) = app.broker.dead_letters("default")
    assert "TimeLimitExceeded" in dead.reason and "time limit of 0.2s" in dead.reason
    assert worker.executor.abandoned() == 1
    stuck.set()


def test_asyncio_pool_cancels_an_overrunning_coroutine_then_retries_it(app: Hurtle) -> None:
    cancelled: list[int] = []

    @app.task(time_limit=0.1, retries=1, retry_delay=0.01)
    async def sleepy() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(1)
            raise

    sleepy.send()
    app.worker(pool="asyncio", concurrency=4, burst=True).run()
    assert cancelled == [1, 1]  # the first attempt and its retry
    (dead,) = app.broker.dead_letters("default")
    assert "failed on attempt 2 of 2" in dead.reason and "TimeLimitExceeded" in dead.reason


def test_a_task_within_its_limit_succeeds_and_its_own_timeout_error_is_not_a_limit(
    app: Hurtle,
) -> None:
    @app.task(time_limit=5, retries=0)
    async def own_timeout() -> None:
        raise TimeoutError("the task's own")

    @app.task(time_limit=5)
    def fine() -> None:
        pass

    own_timeout.send()
    fine.send()
    app.worker(pool="asyncio", burst=True).run()
    (dead,) = app.broker.dead_letters("default")
    assert "TimeoutError: the task's own" in dead.reason
    assert "TimeLimitExceeded" not in dead.reason


def test_solo_off_the_main_thread_fails_the_overrun_once_it_ends(app: Hurtle) -> None:
    @app.task(time_limit=0.05, retries=0)
    def slow() -> None:
        time.sleep(0.2)

    slow.send()
    thread = app.worker(burst=True).run_in_thread()
    thread.join(20)
    (dead,) = app.broker.dead_letters("default")
    assert "TimeLimitExceeded" in dead.reason


@pytest.mark.parametrize("pool", pools("solo", "threads", "asyncio", *GREENLET_POOLS))
def test_overrunning_task_is_stopped_retried_then_dead_lettered_in_a_real_worker(
    project: Project,  # noqa: F811
    pool: str,
) -> None:
    project.send_many("w.limited", [("slow", 60.0), ("fast", 0.01)])
    project.send_many("w.alimited", [("aslow", 60.0)])  # async def: stopped in every pool
    result = project.hurtle(
        "worker", "tasks:app", "--pool", pool, "--concurrency", "4", "--burst", timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert project.lines("start").count("slow") == 2  # the first attempt and one retry
    assert sorted(project.lines("done")) == ["fast"]
    dead = project.app.broker.dead_letters("default")
    assert len(dead) == 2
    assert all("TimeLimitExceeded" in d.reason and "time limit of 0.5s" in d.reason for d in dead)


def test_solo_on_the_main_thread_interrupts_an_inline_overrun_with_no_timer_per_task(
    app: Hurtle,
) -> None:
    assert threading.current_thread() is threading.main_thread()
    ran: list[str] = []

    @app.task(name="t.slow", time_limit=0.2, retries=0)
    def slow() -> None:
        ran.append("slow")
        time.sleep(60)  # interrupted where it waits
        ran.append("not reached")

    @app.task(name="t.fast", time_limit=10, retries=0)
    def fast(i: int) -> None:
        ran.append(f"fast {i}")

    fast.send_many([(i,) for i in range(3)])
    slow.send()
    before = signal.getsignal(signal.SIGALRM)
    worker = app.worker(burst=True)
    worker.run()
    assert worker.processor is not None
    assert worker.processor.pipeline("t.slow").inline  # type: ignore[union-attr]
    assert ran == ["fast 0", "fast 1", "fast 2", "slow"]
    (dead,) = app.broker.dead_letters("default")
    assert "TimeLimitExceeded" in dead.reason and "time limit of 0.2s" in dead.reason
    assert signal.getsignal(signal.SIGALRM) is before  # put back when the worker ends


def test_solo_fails_an_inline_task_that_swallowed_its_time_limit_and_returned(
    app: Hurtle,
) -> None:
    caught: list[str] = []

    @app.task(name="t.stubborn", time_limit=0.1, retries=0)
    def stubborn() -> str:
        try:
            time.sleep(60)
        except Exception as err:
            caught.append(type(err).__name__)
        return "done anyway"

    stubborn.send()
    app.worker(burst=True).run()
    assert caught == ["TimeLimitExceeded"]
    (dead,) = app.broker.dead_letters("default")
    assert "TimeLimitExceeded" in dead.reason


def test_solo_stops_a_task_registered_after_the_worker_started_at_its_limit(
    app: Hurtle,
) -> None:
    @app.task(name="t.first")
    def first() -> None:
        @app.task(name="t.late", time_limit=0.2, retries=0)
        def late(i: int) -> None:
            time.sleep(5)

        late.send_many([(1,), (2,)])  # the second one runs inline, composed already

    first.send()
    app.worker(burst=True).run()
    dead = app.broker.dead_letters("default")
    assert len(dead) == 2
    assert all("TimeLimitExceeded" in d.reason and "time limit of 0.2s" in d.reason for d in dead)


def test_solo_passes_an_alarm_it_did_not_send_to_the_handler_it_replaced(app: Hurtle) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: got.append(signum))
    try:

        @app.task(name="t.alarm", time_limit=30)
        def alarm() -> None:
            signal.pthread_kill(threading.get_ident(), signal.SIGALRM)

        alarm.send()
        app.worker(burst=True).run()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert got == [signal.SIGALRM]
    assert app.broker.dead_letters("default") == []
