"""The pools in-process on the memory broker: asyncio runs coroutines natively and plain
functions on threads, pools scale with the backlog, and prefetch stays bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hurtle import Hurtle
from hurtle.errors import ConfigurationError


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_pool_at_concurrency_500_runs_2000_tasks_exactly_once(app: Hurtle, pool: str) -> None:
    runs: list[int] = []

    if pool == "asyncio":

        @app.task(name="nap")
        async def nap(i: int) -> None:
            await asyncio.sleep(0.01)
            runs.append(i)
    else:

        @app.task(name="nap")
        def nap(i: int) -> None:
            time.sleep(0.01)
            runs.append(i)

    app.tasks["nap"].send_many([(i,) for i in range(2000)])
    app.worker(pool=pool, concurrency=500, burst=True).run()
    assert sorted(runs) == list(range(2000))
    assert app.broker.stats(["default"])["default"].dead == 0


def test_asyncio_pool_awaits_coroutines_on_one_loop_many_at_once(app: Hurtle) -> None:
    in_flight: set[int] = set()
    most = [0]
    loops: set[int] = set()

    @app.task
    async def meet(i: int) -> None:
        loops.add(id(asyncio.get_running_loop()))
        in_flight.add(i)
        most[0] = max(most[0], len(in_flight))
        for _ in range(200):  # wait (bounded) until all 50 are in flight together
            if most[0] >= 50:
                break
            await asyncio.sleep(0.01)
        in_flight.discard(i)

    meet.send_many([(i,) for i in range(50)])
    app.worker(pool="asyncio", concurrency=50, burst=True).run()
    assert most[0] == 50
    assert len(loops) == 1


def test_asyncio_pool_runs_plain_functions_on_threads_without_blocking_the_loop(
    app: Hurtle,
) -> None:
    barrier = threading.Barrier(4, timeout=10)
    ran: list[str] = []

    @app.task
    def blocking(i: int) -> None:
        barrier.wait()  # passes only if four run at once, each on its own thread
        ran.append(threading.current_thread().name)

    @app.task
    async def quick() -> None:
        ran.append("quick")

    blocking.send_many([(i,) for i in range(4)])
    quick.send()
    app.worker(pool="asyncio", concurrency=8, burst=True).run()
    assert len(ran) == 5 and "quick" in ran
    assert len({name for name in ran if name != "quick"}) == 4


def test_threads_pool_scales_up_with_the_backlog_between_min_and_max(app: Hurtle) -> None:
    barrier = threading.Barrier(8, timeout=10)
    ran: list[int] = []

    @app.task
    def meet(i: int) -> None:
        barrier.wait()  # only passes once the pool has grown to eight threads
        ran.append(i)

    meet.send_many([(i,) for i in range(16)])
    worker = app.worker(pool="threads", concurrency=8, min_concurrency=1, burst=True)
    worker.run()
    assert sorted(ran) == list(range(16))


def test_prefetch_is_bounded_by_the_concurrency(app: Hurtle) -> None:
    started = threading.Event()
    release = threading.Event()

    @app.task
    def slow() -> None:
        started.set()
        release.wait(10)

    slow.send_many([()] * 50)
    worker = app.worker(pool="threads", concurrency=3)
    thread = worker.run_in_thread()
    assert started.wait(5)
    time.sleep(0.2)  # give the fetch loop every chance to overfetch
    held = app.broker.stats(["default"])["default"].in_flight
    release.set()
    worker.stop()
    thread.join(10)
    assert held <= 6  # three running and three prefetched, not the whole backlog


def test_min_max_concurrency_is_refused_for_pools_that_do_not_scale() -> None:
    from hurtle.cli.worker import parse_concurrency

    assert parse_concurrency("4,16", "threads") == (16, 4)
    assert parse_concurrency("7", "asyncio") == (7, None)
    with pytest.raises(ConfigurationError, match="MIN,MAX"):
        parse_concurrency("4,16", "asyncio")
    with pytest.raises(ConfigurationError, match="got '9,2'"):
        parse_concurrency("9,2", "threads")


def test_threads_run_what_a_slow_task_holds_in_its_chunk_on_the_other_threads(
    app: Hurtle,
) -> None:
    release = threading.Event()
    fast_ran: list[int] = []
    slow_released: list[bool] = []

    @app.task
    def slow() -> None:
        slow_released.append(release.wait(30))  # released only once every fast task ran

    @app.task
    def fast(i: int) -> None:
        fast_ran.append(i)
        if len(fast_ran) == 40:
            release.set()

    app.broker.publish([slow.message((), {})] + [fast.message((i,), {}) for i in range(40)])
    app.worker(pool="threads", concurrency=2, burst=True).run()
    assert sorted(fast_ran) == list(range(40))
    assert slow_released == [True]
