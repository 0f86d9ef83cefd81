"""A worker whose Redis goes away while it stops settles its outcomes once Redis is back,
within its shutdown's time, instead of dropping them (and running their tasks again)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("redis")

from hurtle import Hurtle

MakeServer = Callable[..., Any]


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_outcomes_held_up_by_an_outage_are_settled_when_redis_returns_during_shutdown(
    make_redis_server: MakeServer,
) -> None:
    server = make_redis_server(appendonly=True)  # restarts with what it had
    app = Hurtle(server.url, heartbeat_timeout=60)
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()

    @app.task(retries=0)
    def hold() -> None:
        runs.append("hold")
        started.set()
        release.wait(30)

    @app.task(retries=1, retry_delay=60)
    def flaky() -> None:
        runs.append("flaky")
        raise ValueError("fails once")

    hold.send()
    flaky.send()
    worker = app.worker()
    thread = worker.run_in_thread()
    try:
        assert started.wait(10)
        server.kill()
        release.set()  # both outcomes (an ack, a retry) now wait for Redis
        wait_for(lambda: runs == ["hold", "flaky"])
        worker.stop()
        assert worker.acker is not None
        acker = worker.acker
        wait_for(lambda: acker.stopping)
        tried = acker.failures
        wait_for(lambda: acker.failures >= tried + 3)  # still trying during the shutdown
        server.start()  # a short outage: back well within the shutdown's time
        thread.join(30)
        assert not thread.is_alive()
        assert acker.pending == 0 and acker.dropped == 0
        stats = app.broker.stats(["default"])["default"]
        # done for good, and the retry scheduled: nothing held, nothing to run again now
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 1, 0, 0)
    finally:
        release.set()
        app.close()
