"""``Hurtle.cancel`` on a task that already started, in real ``hurtle worker`` processes on
SQLite and Redis: the task is interrupted where its pool can (the solo pool on a process's main
thread, ``--processes`` children: ``TaskCancelled`` raised where it waits; ``async def`` tasks
in the asyncio pool: ``asyncio.CancelledError``), told elsewhere (``hurtle.current().cancelled``
turns true in the threads, gevent and eventlet pools), and recorded ``cancelled`` either way: no
retry, a dead letter with that reason, a handle that raises ``TaskFailed`` (``Cancelled``). A
worker of short tasks never asks about them."""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project
from hurtle import Hurtle, TaskFailed
from hurtle.errors import HurtleError

TASKS = textwrap.dedent(
    """
    import asyncio
    import os
    import time

    import hurtle
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line} {os.getpid()}\\n")


    @app.task(name="c.polite", retries=3, store_result=True)
    def polite(i):
        record(f"start {i}")
        now = hurtle.current()
        deadline = time.monotonic() + 60
        while not now.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        record(f"{'saw' if now.cancelled else 'missed'} {i}")
        return "what it had done"


    @app.task(name="c.sleepy", retries=3, store_result=True)
    def sleepy(i):
        record(f"start {i}")
        time.sleep(60)
        record(f"done {i}")


    @app.task(name="c.asleepy", retries=3, store_result=True)
    async def asleepy(i):
        record(f"start {i}")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            record(f"cancelled {i}")
            raise
        record(f"done {i}")


    @app.task(name="c.quick")
    def quick(i):
        return i
    """
)

GREENLET_POOLS = ("gevent", "eventlet")


def pools(*names: str) -> list[object]:
    return [
        pytest.param(
            p,
            marks=pytest.mark.skipif(
                p in GREENLET_POOLS and importlib.util.find_spec(p) is None,
                reason=f"{p} is not installed",
            ),
        )
        for p in names
    ]


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = None if request.param == "sqlite" else str(request.getfixturevalue("redis_url"))
    p = Project(tmp_path, TASKS, ["c.polite", "c.sleepy", "c.asleepy", "c.quick"], url)
    yield p
    p.app.close()


def cancel_once_started(project: Project, task: str, *options: str) -> tuple[str, str]:
    """Start a worker with ``options``, send ``task``, cancel it once it started; returns its
    id and the worker's output once it stopped."""
    worker = project.popen("worker", "tasks:app", *options)
    try:
        message_id = project.send(task, 0)
        project_wait(project, lambda: project.lines("start") == ["0"])
        project.app.cancel(message_id)
        handle = project.app.handle(message_id)
        with pytest.raises(TaskFailed) as failed:
            handle.result(30)
        assert failed.value.type == "Cancelled"
        assert "cancelled while it ran" in failed.value.message
    finally:
        worker.terminate()
        project.stop(worker)
    return message_id, project.output(worker)


def project_wait(project: Project, check: object, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not seen within {timeout}s: {project.runs()}"
        time.sleep(0.02)


def assert_cancelled_once(project: Project, message_id: str) -> None:
    """Run once, not retried, a dead letter ``cancelled`` found by its id."""
    assert project.lines("start") == ["0"]
    dead = project.app.broker.find_dead(message_id)
    assert dead is not None and dead.reason == "cancelled"
    assert project.app.broker.stats()["default"].ready == 0


@pytest.mark.parametrize("pool", pools("threads", *GREENLET_POOLS))
def test_a_running_task_sees_cancelled_in_cooperative_pools(project: Project, pool: str) -> None:
    message_id, _ = cancel_once_started(project, "c.polite", "--pool", pool, "-c", "2")
    assert project.lines("saw") == ["0"]  # it stopped because it was told, and returned
    assert_cancelled_once(project, message_id)


def test_solo_on_the_main_thread_stops_a_running_task_where_it_waits(project: Project) -> None:
    message_id, _ = cancel_once_started(project, "c.sleepy")  # ``hurtle worker``: solo
    assert project.lines("done") == []  # interrupted in its sleep
    assert_cancelled_once(project, message_id)


def test_a_processes_child_stops_a_running_task_as_its_time_limit_would(
    project: Project,
) -> None:
    message_id, _ = cancel_once_started(project, "c.sleepy", "--processes", "2")
    assert project.lines("done") == []
    assert_cancelled_once(project, message_id)


def test_the_asyncio_pool_cancels_a_running_coroutine(project: Project) -> None:
    message_id, _ = cancel_once_started(project, "c.asleepy", "--pool", "asyncio")
    assert project.lines("cancelled") == ["0"] and project.lines("done") == []
    assert_cancelled_once(project, message_id)


def test_the_asyncio_pool_tells_a_plain_task_on_its_threads(project: Project) -> None:
    message_id, _ = cancel_once_started(project, "c.polite", "--pool", "asyncio")
    assert project.lines("saw") == ["0"]
    assert_cancelled_once(project, message_id)


def test_a_worker_of_short_tasks_never_asks_about_cancellations(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")

    @app.task
    def quick(i: int) -> int:
        return i

    quick.send_many([(i,) for i in range(5000)])
    worker = app.worker(pool="threads", concurrency=4, burst=True)
    worker.progress_interval = 3600.0  # no look while they run: only tasks that outlive one
    worker.run()
    assert worker.tracker is not None and worker.tracker.polls == 0
    assert worker.processed == 5000
    app.close()


def test_current_cancelled_is_false_for_a_task_nobody_cancelled(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")
    seen: list[bool] = []

    @app.task(store_result=True)
    def look() -> str:
        import hurtle

        seen.append(hurtle.current().cancelled)
        return "done"

    h = look.send()
    worker = app.worker(burst=True)
    worker.run()
    assert (h.result(5), seen) == ("done", [False])
    with pytest.raises(HurtleError):
        look()  # called here, not by a worker: current() says so
    app.close()
