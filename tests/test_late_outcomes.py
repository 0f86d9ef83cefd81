"""A worker taken for dead while it lives (paused with SIGSTOP past its heartbeat timeout, as a
host cut off from the broker looks): its task runs again on another worker, and when it comes
back, its late outcome is ignored (docs/brokers.md, "Delivery semantics"): the stored result is
the redelivered copy's. On every broker that serves several processes; the conformance suite
(``tests/brokers/test_late_contract.py``) covers the memory broker too, through the broker API."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import Project
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures

TASKS = """
import os
import time

from hurtle import Hurtle

app = Hurtle()


@app.task(name="late.work", retries=0, store_result=True)
def work(seconds):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"start {os.getpid()}\\n")
    time.sleep(seconds)
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"done {os.getpid()}\\n")
    return os.getpid()
"""

ENV = {"HURTLE_HEARTBEAT_TIMEOUT": "1"}


#: The fixture of each broker's URL (SQLite: the project's own file). The memory broker lives in
#: one process: ``tests/brokers/test_late_contract.py`` covers it through the broker API.
URLS = {
    "sqlite": None,
    "redis": "redis_url",
    "redis-cluster": "redis_cluster_url",
    "nats": "nats_url",
}


@pytest.fixture(params=list(URLS))
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Project:
    fixture = URLS[request.param]
    url = None if fixture is None else str(request.getfixturevalue(fixture))
    return Project(tmp_path, TASKS, ["late.work"], url=url)


@pytest.mark.timeout(120)
def test_the_late_outcome_of_a_worker_taken_for_dead_does_not_replace_the_redelivered_one(
    project: Project,
) -> None:
    stale = project.popen("worker", "tasks:app", "--no-scheduler", **ENV)
    workers: list[subprocess.Popen[str]] = [stale]
    try:
        handle = project.app.handle(project.send("late.work", 2.0))
        project.wait_for(lambda: project.runs() == [f"start {stale.pid}"])
        os.kill(stale.pid, signal.SIGSTOP)  # silent past its heartbeat timeout: taken for dead
        fresh = project.popen("worker", "tasks:app", "--no-scheduler", **ENV)
        workers.append(fresh)
        project.wait_for(lambda: f"done {fresh.pid}" in project.runs())
        project.wait_for(lambda: handle.result(timeout=10) == fresh.pid)
        os.kill(stale.pid, signal.SIGCONT)  # it finishes its copy and reports it, late
        project.wait_for(lambda: f"done {stale.pid}" in project.runs())
        stale.send_signal(signal.SIGTERM)  # a graceful stop flushes its outcomes
        assert project.stop(stale) == 0, project.output(stale)
        assert handle.result(timeout=10) == fresh.pid, "the late outcome replaced the redelivered"
    finally:
        for w in workers:
            if w.poll() is None:
                os.kill(w.pid, signal.SIGCONT)
                w.kill()
                w.wait()
