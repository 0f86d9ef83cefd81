"""A real ``hurtle worker`` on SQLite: the graceful stop keeps its deadline in solo, a slow task
keeps no backlog from an idle worker, and a task that breaks the error formatting kills nothing.
Tasks log ``start``/``done`` lines; nothing here measures time."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project

TASKS = textwrap.dedent(
    """
    import os
    import time

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line} {os.getpid()}\\n")


    @app.task(name="l.gate", retries=0)
    def gate(i, path):
        # runs until ``path`` exists (at most a minute)
        record(f"start {i}")
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        record(f"done {i}")


    @app.task(name="l.quick", retries=0)
    def quick(i):
        record(f"start {i}")
        record(f"done {i}")


    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("__str__ raised")


    @app.task(name="l.unprintable", retries=1, retry_delay=0.01)
    def unprintable(i):
        record(f"start {i}")
        raise Unprintable()
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, ("l.gate", "l.quick", "l.unprintable"))
    yield p
    p.app.close()


def test_solo_hands_back_a_task_still_running_at_the_shutdown_timeout(project: Project) -> None:
    gate = str(project.root / "gate")  # not created: the task would run for a minute
    project.send_many("l.gate", [(0, gate), (1, gate)])
    worker = project.popen("worker", "tasks:app", "--shutdown-timeout", "0.5")
    project.wait_for(lambda: project.lines("start") == ["0"])
    worker.send_signal(signal.SIGTERM)
    assert project.stop(worker, timeout=30) == 0, project.output(worker)
    assert project.lines("done") == []  # it exited long before the task could have finished
    assert "after the shutdown timeout of 0.5s: handing them back" in project.output(worker)
    assert project.stats() == {"ready": 2, "delayed": 0, "in_flight": 0, "dead": 0}

    Path(gate).touch()  # the task can finish now: it runs again, to its end
    result = project.hurtle("worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    assert sorted(project.lines("done")) == ["0", "1"]
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


@pytest.mark.parametrize("broker", ["sqlite", "redis"])
def test_a_slow_task_in_solo_keeps_no_backlog_from_an_idle_worker(
    tmp_path: Path, request: pytest.FixtureRequest, broker: str
) -> None:
    url = request.getfixturevalue("redis_url") if broker == "redis" else None
    project = Project(tmp_path, TASKS, ("l.gate", "l.quick", "l.unprintable"), url)
    try:
        _slow_task_keeps_no_backlog(project)
    finally:
        project.app.close()


def _slow_task_keeps_no_backlog(project: Project) -> None:
    gate = str(project.root / "gate")
    quick = [str(i) for i in range(1, 201)]
    project.send("l.gate", 0, gate)  # first in line: the first worker takes it with a batch
    project.send_many("l.quick", [(int(i),) for i in quick])
    slow = project.popen("worker", "tasks:app")
    project.wait_for(lambda: "0" in project.lines("start"))
    idle = project.popen("worker", "tasks:app")
    try:
        # every quick task runs while the slow one still runs (its "done 0" is not there)
        project.wait_for(lambda: set(project.lines("done")) >= set(quick))
        assert "0" not in project.lines("done")
        # only the slow task stays held (the others' acknowledgements are flushed in batches)
        project.wait_for(lambda: project.stats()["in_flight"] == 1)
    finally:
        Path(gate).touch()
        for proc in (slow, idle):
            proc.send_signal(signal.SIGTERM)
    assert project.stop(slow) == 0, project.output(slow)
    assert project.stop(idle) == 0, project.output(idle)
    assert sorted(project.lines("done"), key=int) == ["0", *quick]  # each exactly once
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_task_whose_error_cannot_be_printed_kills_no_worker(project: Project, pool: str) -> None:
    project.send("l.unprintable", 0)
    project.send_many("l.quick", [(i,) for i in range(1, 11)])
    result = project.hurtle("worker", "tasks:app", "--pool", pool, "--burst")
    assert result.returncode == 0, result.stderr
    assert project.lines("start").count("0") == 2  # the attempt was counted: one retry
    assert sorted(project.lines("done"), key=int) == [str(i) for i in range(1, 11)]
    (dead,) = project.app.broker.dead_letters("default")
    message = dead.message()
    assert message is not None
    assert message.headers["error"] == "Unprintable: <unprintable Unprintable>"
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 1}
