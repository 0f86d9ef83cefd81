"""The real worker on the Redis broker: the same outcomes as on the memory broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("redis")

from hurtle import Hurtle
from hurtle.middleware import Job, Middleware


@pytest.fixture
def app(redis_url: str) -> Iterator[Hurtle]:
    app = Hurtle(redis_url, default_retry_delay=0.01, heartbeat_timeout=5)
    yield app
    app.close()


def test_burst_worker_runs_every_task_and_dead_letters_garbage_on_redis(app: Hurtle) -> None:
    seen: list[int] = []

    @app.task
    def record(i: int) -> None:
        seen.append(i)

    record.send_many([(i,) for i in range(2500)])
    app.broker.publish_raw("default", [b"\x00garbage\xff"])
    app.worker(burst=True).run()
    assert sorted(seen) == list(range(2500))
    [dead] = app.broker.dead_letters("default")
    assert dead.raw == b"\x00garbage\xff"
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 1)


def test_worker_carries_on_after_redis_restarts(make_redis_server: Callable[..., Any]) -> None:
    server = make_redis_server(appendonly=True)
    app = Hurtle(server.url, heartbeat_timeout=5)
    seen: list[int] = []
    done = threading.Event()

    @app.task
    def record(i: int) -> None:
        seen.append(i)
        if i == 2:
            done.set()

    worker = app.worker()
    thread = worker.run_in_thread()
    try:
        record.send(1)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()
        time.sleep(0.5)  # the worker's fetches fail meanwhile; it must log and keep trying
        server.start()
        record.send(2)
        assert done.wait(15)
        assert seen == [1, 2]
    finally:
        worker.stop()
        thread.join(15)
        app.close()


def test_a_solo_batch_is_decided_on_before_the_next_batch_is_fetched(app: Hurtle) -> None:
    # Middleware that decide before a batch runs may read the broker (debounce's latest
    # records); the solo loop's fetch of the next batch waits for them, as the server would run
    # it in front of their reads: while they decide, the next batch is still ready.
    total = 3000
    seen: list[tuple[int, int]] = []  # per batch: its size, what was still ready

    class Watch(Middleware):
        def before_batch(self, jobs: list[Job]) -> None:
            seen.append((len(jobs), app.broker.stats(["default"])["default"].ready))

    app.add_middleware(Watch())

    @app.task
    def record(i: int) -> None: ...

    record.send_many([(i,) for i in range(total)])
    app.worker(burst=True).run()
    assert sum(n for n, _ in seen) == total and len(seen) > 1
    taken = 0
    for n, ready in seen:
        taken += n
        assert ready == total - taken
