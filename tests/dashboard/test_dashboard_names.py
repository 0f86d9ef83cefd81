"""Names that clients choose do not pile up: task names the app does not register are counted
as ``(other)`` in ``/metrics`` and ``/api/tasks``; queues empty and unused for ``forget_after``
seconds leave ``/api/overview``, ``/api/queues``, ``/metrics`` and ``hurtle status`` (on the
memory broker and a real Redis); ``hurtle queue APP forget Q`` forgets one at once, and refuses
a queue that holds messages."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("prometheus_client", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from helpers import Project
from hurtle import Hurtle
from hurtle.dashboard import create_app
from hurtle.ids import new_id
from hurtle.message import Message


def wait_for(predicate: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


@pytest.fixture(params=["memory", "redis"])
def app(request: pytest.FixtureRequest) -> Iterator[Hurtle]:
    url = "memory://" if request.param == "memory" else request.getfixturevalue("redis_url")
    app = Hurtle(url, heartbeat_interval=0.05)

    @app.task(name="tasks.add", queue="math", retries=0)
    def add(x: int, y: int) -> int:
        return x + y

    yield app
    app.close()


def series(metrics: str, name: str) -> list[str]:
    return [line for line in metrics.splitlines() if line.startswith(name + "{")]


def test_task_names_the_app_does_not_register_are_counted_as_other(app: Hurtle) -> None:
    strangers = [
        Message(id=new_id(), task=f"someone.else_{i}", queue="math", args=(i,)) for i in range(40)
    ]
    app.broker.publish(strangers)  # another producer: the workers dead-letter them
    app.tasks["tasks.add"].send_many([(1, 2), (3, 4)])
    worker = app.worker(queues=["math"])
    thread = worker.run_in_thread()
    try:
        wait_for(lambda: sum(t.processed for t in app.broker.totals()) == 42)
        with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
            metrics = client.get("/metrics").text
            rows = client.get("/api/tasks").json()
    finally:
        worker.stop()
        thread.join(30)
    assert series(metrics, "hurtle_tasks_dead_lettered_total") == [
        'hurtle_tasks_dead_lettered_total{queue="math",task="(other)"} 40.0',
        'hurtle_tasks_dead_lettered_total{queue="math",task="tasks.add"} 0.0',
    ]
    assert "someone.else" not in metrics
    assert [(r["task"], r["processed"], r["dead_lettered"]) for r in rows] == [
        ("(other)", 40, 40),
        ("tasks.add", 2, 0),
    ]


def test_queues_empty_and_unused_are_forgotten_and_known_again_with_a_message(
    app: Hurtle,
) -> None:
    asgi = create_app(app, token="", forget_after=0.3)
    many = [f"client-{i}" for i in range(30)]
    with TestClient(asgi, base_url="http://127.0.0.1") as client:
        for name in many:
            r = client.post(
                f"/api/queues/{name}/messages", json={"task": "tasks.add", "args": [1, 2]}
            )
            assert r.status_code == 201, r.text
            assert client.delete(f"/api/queues/{name}/messages").json() == {"purged": 1}
        client.post("/api/queues/held/messages", json={"task": "tasks.add", "args": [1, 2]})
        app.pause("stopped")
        worker = app.worker(queues=["consumed"])
        thread = worker.run_in_thread()
        try:
            app.tasks["tasks.add"].options(queue="consumed").send(1, 2)
            wait_for(lambda: app.broker.stats(["consumed"])["consumed"].ready == 0)
            wait_for(lambda: any("consumed" in w.queues for w in app.broker.workers()))

            def names() -> set[str]:
                return {q["name"] for q in client.get("/api/overview").json()["queues"]}

            wait_for(lambda: not set(many) & names())
            assert {"math", "held", "stopped", "consumed"} <= names()
            queues = {q["name"] for q in client.get("/api/queues").json()}
            assert not set(many) & queues
            metrics = client.get("/metrics").text
            assert "client-" not in metrics
            assert not set(many) & set(app.broker.queues())
        finally:
            worker.stop()
            thread.join(30)
        client.post("/api/queues/client-7/messages", json={"task": "tasks.add", "args": [1, 2]})
        assert "client-7" in {q["name"] for q in client.get("/api/queues").json()}


def test_forget_after_must_be_seconds(app: Hurtle) -> None:
    from hurtle.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="forget_after must be"):
        create_app(app, token="", forget_after=-1)


TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(queue="main")
    def noop(x):
        return x
    """
)


def test_queue_forget_forgets_an_empty_queue_and_refuses_one_with_messages(
    tmp_path: Path,
) -> None:
    project = Project(tmp_path, TASKS, ["tasks.noop"])
    project.app.tasks["tasks.noop"].options(queue="extra").send(1)
    refused = project.hurtle("queue", "tasks:app", "forget", "extra")
    assert refused.returncode == 1
    assert "not forgotten: it holds 1 ready" in refused.stderr
    assert "extra" in project.status()
    assert project.app.broker.purge("extra") == 1
    done = project.hurtle("queue", "tasks:app", "forget", "extra")
    assert done.returncode == 0, done.stderr
    assert "queue 'extra' forgotten" in done.stdout
    assert "extra" not in project.status()
    again = project.hurtle("queue", "tasks:app", "forget", "extra")
    assert again.returncode == 0 and "not known" in again.stdout
    project.app.close()
