"""An attempt number means one thing under one name everywhere a dead letter is shown: the
attempt its message was on, 1 for the first, as the reason text counts it (``hurtle dead list``
as text and as JSON, the HTTP API and its OpenAPI document, the dashboard page)."""

from __future__ import annotations

import json
import textwrap
from importlib import resources
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from helpers import Project
from hurtle.dashboard import create_app

TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()

    @app.task(name="tasks.broken", queue="q", retries=1, retry_delay=0.01)
    def broken():
        raise ValueError("always broken")
    """
)


def test_the_attempt_of_a_dead_letter_is_the_same_number_under_the_same_name_everywhere(
    tmp_path: Path,
) -> None:
    project = Project(tmp_path, TASKS, ())
    project.app.task(name="tasks.broken", queue="q", retries=1)(lambda: None)
    try:
        message_id = project.send("tasks.broken")
        ran = project.hurtle("worker", "tasks:app", "--burst")
        assert ran.returncode == 0, ran.stderr

        text = project.hurtle("dead", "tasks:app", "list")
        assert "failed on attempt 2 of 2" in text.stdout
        [row] = json.loads(project.hurtle("dead", "tasks:app", "list", "--json").stdout)
        assert row["attempt"] == 2 and "attempts" not in row
        assert "failed on attempt 2 of 2" in row["reason"]

        with TestClient(create_app(project.app, token=""), base_url="http://127.0.0.1") as client:
            [dead] = client.get("/api/queues/q/dead").json()
            assert dead["attempt"] == 2 and "attempts" not in dead
            assert client.get(f"/api/tasks/{message_id}").json()["attempt"] == 2
            schema = client.get("/api/openapi.json").json()["components"]["schemas"]
        for name in ("DeadLetter", "TaskLookup"):
            props = schema[name]["properties"]
            assert "attempts" not in props
            assert props["attempt"]["anyOf"][0]["minimum"] == 1
        page = resources.files("hurtle.dashboard").joinpath("static/app.js").read_text()
        assert "d.attempt " in page and ".attempts" not in page
    finally:
        project.app.close()
