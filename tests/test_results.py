"""Results end to end: a real worker process stores them, a test process waits on handles; many
waiters on Redis share a few connections; SQLite prunes expired records as it writes new ones."""

from __future__ import annotations

import signal
import sqlite3
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import Project
from hurtle import Hurtle, TaskFailed
from hurtle.brokers import StoredResult, make_broker
from hurtle.brokers.redis import RESULT_CONNECTIONS, RedisBroker

TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="tasks.add", store_result=True)
    def add(x, y):
        return {"sum": x + y, "pair": [x, y]}


    @app.task(name="tasks.fail", store_result=True, retries=0)
    def fail(n):
        raise ValueError(f"bad input {n}")
    """
)


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = str(request.getfixturevalue("redis_url")) if request.param == "redis" else None
    p = Project(tmp_path, TASKS, (), url=url)
    for name in ("tasks.add", "tasks.fail"):
        p.app.task(name=name, store_result=True, retries=0)(lambda *a: None)
    yield p
    p.app.close()


def test_a_worker_process_stores_results_that_handles_in_another_process_wait_for(
    project: Project,
) -> None:
    add, fail = project.app.tasks["tasks.add"], project.app.tasks["tasks.fail"]
    handles = add.send_many([(i, 1) for i in range(20)])
    failing = fail.send(3)
    worker = project.popen("worker", "tasks:app")
    try:
        assert [h.result(timeout=60) for h in handles] == [
            {"sum": i + 1, "pair": [i, 1]} for i in range(20)
        ]
        with pytest.raises(TaskFailed) as info:
            failing.result(timeout=60)
        assert (info.value.type, info.value.message) == ("ValueError", "bad input 3")
        # sent while the worker runs: the waiter is woken (Redis) or re-reads (SQLite)
        assert add.send(40, 2).result(timeout=60) == {"sum": 42, "pair": [40, 2]}
        assert project.app.handle(failing.id).state() == "dead"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert project.stop(worker) == 0, project.output(worker)


def _clients(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list())
    finally:
        client.close()


def test_two_hundred_waiters_on_redis_share_a_few_connections(redis_url: str) -> None:
    app = Hurtle(redis_url)
    try:
        @app.task(store_result=True)
        def square(x: int) -> int:
            return x * x

        handles = square.send_many([(i,) for i in range(200)])
        before = _clients(redis_url)
        results: dict[int, Any] = {}
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, handles[i].result(60)))
            for i in range(200)
        ]
        for t in threads:
            t.start()
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        deadline = time.monotonic() + 30
        while len(broker._listener._watchers) < 200:  # every thread waits now
            assert time.monotonic() < deadline
            time.sleep(0.01)
        during = _clients(redis_url)
        worker = app.worker(queues=["default"])
        runner = worker.run_in_thread()
        try:
            for t in threads:
                t.join(60)
        finally:
            worker.stop()
            runner.join(30)
        assert results == {i: i * i for i in range(200)}
        # the listener's connection and the pool of reads, not one per waiter
        assert during - before <= RESULT_CONNECTIONS
    finally:
        app.close()


def test_sqlite_prunes_expired_results_when_it_writes_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "hurtle.db"
    broker = make_broker(f"sqlite:///{path}")
    try:
        consumer = broker.consumer(["q"])
        consumer.ack((), [StoredResult(f"old{i}", b"x", 0.01) for i in range(150)])
        consumer.ack((), [StoredResult("kept", b"y", 3600.0)])

        def rows() -> int:
            with sqlite3.connect(path) as conn:
                return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])

        deadline = time.monotonic() + 10
        while broker.get_result("old0") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert rows() == 151  # expired, not yet pruned: reads skip them
        consumer.ack((), [StoredResult("new1", b"z", 3600.0)])  # prunes up to 100
        consumer.ack((), [StoredResult("new2", b"z", 3600.0)])  # and the rest
        assert rows() == 3
        assert broker.get_result("kept") == b"y"
    finally:
        broker.close()
