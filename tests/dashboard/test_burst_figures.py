"""Workers that live less than a heartbeat interval still count: two real ``hurtle worker
--burst`` processes run a backlog and exit, and the dashboard's figures hold every task they
ran, and neither of them is listed as alive after it left."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("prometheus_client", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from helpers import Project
from hurtle.dashboard import create_app
from test_cli import TASKS

TASK_COUNT = 1000
#: Longer than the workers live: no periodic beat reports their counts for them.
SLOW_BEATS = {"HURTLE_HEARTBEAT_INTERVAL": "120", "HURTLE_HEARTBEAT_TIMEOUT": "600"}


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Project:
    url = None if request.param == "sqlite" else str(request.getfixturevalue("redis_url"))
    p = Project(tmp_path, TASKS, ("tasks.add",), url=url)
    yield p  # type: ignore[misc]
    p.app.close()


def processed_total(metrics: str) -> float:
    return sum(
        float(value)
        for value in re.findall(
            r'^hurtle_tasks_processed_total\{[^}]*task="tasks\.add"[^}]*\} (\S+)$',
            metrics,
            re.MULTILINE,
        )
    )


def test_two_burst_workers_are_counted_whole_and_not_listed_once_gone(project: Project) -> None:
    project.send_many("tasks.add", [(i, i) for i in range(TASK_COUNT)])
    workers = [project.popen("worker", "tasks:app", "--burst", **SLOW_BEATS) for _ in range(2)]
    for proc in workers:
        assert proc.wait(120) == 0, project.output(proc)
    assert len(project.runs()) == TASK_COUNT
    with TestClient(create_app(project.app, token=""), base_url="http://127.0.0.1") as client:
        assert processed_total(client.get("/metrics").text) == TASK_COUNT
        assert client.get("/api/overview").json()["totals"]["processed"] == TASK_COUNT
        assert client.get("/api/workers").json() == []
