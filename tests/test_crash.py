"""Crash recovery with real worker processes killed by SIGKILL, on SQLite, Redis, a Redis
Cluster and NATS."""

from __future__ import annotations

import collections
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures
from test_cli import TASKS


@pytest.fixture(params=["sqlite", "redis", "redis-cluster", "nats"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = None
    if request.param in ("redis", "nats"):
        url = str(request.getfixturevalue(f"{request.param}_url"))
    elif request.param == "redis-cluster":
        url = str(request.getfixturevalue("redis_cluster_url"))
    p = Project(tmp_path, TASKS, ("tasks.add", "tasks.slow", "tasks.broken"), url)
    yield p
    p.app.close()


def test_tasks_of_a_sigkilled_worker_run_elsewhere_once_its_heartbeat_lapses(
    project: Project,
) -> None:
    total = 600
    project.app.tasks["tasks.slow"].send_many([(i, 0.002) for i in range(total)])
    env = {"HURTLE_HEARTBEAT_TIMEOUT": "1"}
    victim = project.popen("worker", "tasks:app", **env)
    project.wait_for(lambda: sum(r.startswith("done") for r in project.runs()) >= 50)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert victim.returncode == -signal.SIGKILL
    before = project.status()["default"]
    assert before["in_flight"] > 0  # the dead worker still holds its batch

    rescuer = project.hurtle("worker", "tasks:app", "--burst", timeout=120, **env)
    assert rescuer.returncode == 0, rescuer.stderr
    done = collections.Counter(r.split()[1] for r in project.runs() if r.startswith("done"))
    assert set(done) == {str(i) for i in range(total)}  # every task ran at least once
    duplicates = sum(n - 1 for n in done.values())
    assert duplicates <= before["in_flight"]  # only what the dead worker held ran twice
    assert project.status()["default"] == {
        "ready": 0,
        "delayed": 0,
        "in_flight": 0,
        "dead": 0,
        "paused": False,
    }


def test_a_slow_task_on_a_live_worker_is_never_given_to_another_worker(
    project: Project,
    tmp_path: Path,
) -> None:
    env = {"HURTLE_HEARTBEAT_TIMEOUT": "0.5"}
    project.send("tasks.slow", "long", 3.0)
    slow_worker = project.popen("worker", "tasks:app", **env)
    project.wait_for(lambda: "start long" in project.runs())
    # a second worker, running while the slow task outlives the heartbeat timeout six times
    other = project.hurtle("worker", "tasks:app", "--burst", timeout=60, **env)
    assert other.returncode == 0, other.stderr
    slow_worker.send_signal(signal.SIGTERM)
    assert slow_worker.wait(timeout=30) == 0, project.output(slow_worker)
    assert project.runs().count("start long") == 1
    assert project.runs().count("done long") == 1
