"""``POST /api/queues/{queue}/messages`` refuses what ``send()`` refuses, each request on its
own: an unknown task name, arguments that do not fit, arguments that cannot be encoded; and
the documentation's own example (docs/dashboard.md, with README's ``tasks.py``) enqueues a
message that a worker runs. On SQLite and a real Redis."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("httpx")

import httpx
from starlette.testclient import TestClient

from hurtle import Hurtle
from hurtle.brokers import QueueStats, make_broker
from hurtle.brokers.memory import MemoryBroker
from hurtle.dashboard import create_app
from hurtle.dashboard.batcher import Batcher
from hurtle.errors import EncodeError
from hurtle.message import Message

ROOT = Path(__file__).resolve().parent.parent.parent


def wait_for(predicate: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hurtle.db'}"
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def app(url: str) -> Iterator[Hurtle]:
    app = Hurtle(url, heartbeat_interval=0.05)

    @app.task(name="tasks.add", retries=0)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="tasks.ping", retries=0)
    def ping() -> str:
        return "pong"

    yield app
    app.close()


def post_all(asgi: Any, bodies: list[Any]) -> list[httpx.Response]:
    """Post every body to the enqueue endpoint at once (one event loop, as uvicorn would)."""

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return list(
                await asyncio.gather(
                    *(c.post("/api/queues/default/messages", json=b) for b in bodies)
                )
            )

    return asyncio.run(main())


# -- one bad request among many -------------------------------------------------------------


def test_a_request_that_cannot_be_encoded_fails_alone_among_concurrent_ones(app: Hurtle) -> None:
    asgi = create_app(app, token="", batch_window=0.2)  # wide: the requests share one call
    good = [{"task": "tasks.add", "args": [i, i]} for i in range(20)]
    bad = {"task": "tasks.add", "args": [2**64, 1]}
    answers = post_all(asgi, [*good[:10], bad, *good[10:]])
    refused = answers.pop(10)
    assert refused.status_code == 400, refused.text
    assert "cannot encode the arguments of task 'tasks.add'" in refused.json()["error"]
    assert [a.status_code for a in answers] == [201] * 20, [a.text for a in answers]
    assert app.broker.stats(["default"])["default"].ready == 20
    batcher = asgi.state.dashboard.batcher
    assert batcher.published == 20


def test_the_batcher_encodes_each_request_before_it_joins_a_batch() -> None:
    broker = MemoryBroker()
    batcher = Batcher(broker, window=0.1)

    async def main() -> list[BaseException | None]:
        calls = [
            batcher.publish([Message(id=f"m{i}", task="t", queue="q", args=(i,))])
            for i in range(10)
        ]
        calls.insert(5, batcher.publish([Message(id="bad", task="t", queue="q", args=(2**64,))]))
        return list(await asyncio.gather(*calls, return_exceptions=True))

    outcomes = asyncio.run(main())
    assert isinstance(outcomes.pop(5), EncodeError)
    assert outcomes == [None] * 10
    assert (batcher.calls, batcher.published) == (1, 10)
    assert broker.stats(["q"])["q"].ready == 10


class _RefusesOneTask(MemoryBroker):
    """A broker that refuses messages of one task in ``publish``, whatever the others."""

    def publish(self, messages: Any) -> None:
        if any(m.task == "refused" for m in messages):
            raise EncodeError("this broker refuses task 'refused'; nothing was enqueued")
        super().publish(messages)


def test_a_shared_call_that_refuses_one_requests_content_fails_only_that_request() -> None:
    broker = _RefusesOneTask()
    batcher = Batcher(broker, window=0.1)

    async def main() -> list[BaseException | None]:
        calls = [batcher.publish([Message(id=f"m{i}", task="t", queue="q")]) for i in range(5)]
        calls.insert(2, batcher.publish([Message(id="x", task="refused", queue="q")]))
        return list(await asyncio.gather(*calls, return_exceptions=True))

    outcomes = asyncio.run(main())
    assert "refuses task 'refused'" in str(outcomes.pop(2))
    assert outcomes == [None] * 5
    assert broker.stats(["q"])["q"].ready == 5


def test_a_broker_failure_answers_503_to_every_request_of_the_batch(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")
    app.task(name="tasks.add")(lambda x, y: x + y)
    asgi = create_app(app, token="", batch_window=0.2)
    app.broker.close()  # a closed SQLite broker fails every call
    answers = post_all(asgi, [{"task": "tasks.add", "args": [i, i]} for i in range(5)])
    assert [a.status_code for a in answers] == [503] * 5
    assert all("nothing was enqueued" in a.json()["error"] for a in answers)


# -- task names and signatures ------------------------------------------------------------


def test_an_unknown_task_name_is_refused_naming_the_registered_tasks(app: Hurtle) -> None:
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        r = client.post("/api/queues/default/messages", json={"task": "add", "args": [5, 6]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "unknown task 'add'" in error
    assert "tasks.add, tasks.ping" in error
    assert "--allow-unknown-tasks" in error
    assert app.broker.stats(["default"])["default"].ready == 0


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ({"task": "tasks.add", "args": [1]}, "tasks.add(x, y)"),
        ({"task": "tasks.add", "args": [1, 2, 3]}, "tasks.add(x, y)"),
        ({"task": "tasks.add", "args": [1], "kwargs": {"z": 2}}, "keyword(s) z"),
        ({"task": "tasks.ping", "args": [1]}, "tasks.ping()"),
        ({"task": "tasks.add", "args": [1, 2], "eta": "soon"}, "eta"),
        ({"task": "tasks.add", "args": [1, 2], "priority": True}, "priority"),
    ],
)
def test_arguments_that_do_not_fit_the_signature_are_refused_as_send_refuses_them(
    app: Hurtle, item: dict[str, Any], needle: str
) -> None:
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        r = client.post("/api/queues/default/messages", json=[{"task": "tasks.ping"}, item])
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("message 1: ")
    assert needle in r.json()["error"]
    assert app.broker.stats(["default"])["default"].ready == 0  # nor the good one before it


def test_a_message_is_built_as_send_builds_it(app: Hurtle) -> None:
    app.task(name="tasks.urgent", priority=7, expires=60)(lambda: None)
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        r = client.post("/api/queues/elsewhere/messages", json={"task": "tasks.urgent"})
    assert r.status_code == 201, r.text
    consumer = app.broker.consumer(["elsewhere"])
    try:
        (delivery,) = wait_for(lambda: consumer.fetch(10, 0.5))
        message = Message.decode(delivery.raw)
        assert (message.id, message.queue, message.priority) == (r.json()["id"], "elsewhere", 7)
        assert message.expires > time.time()
        consumer.ack([delivery])
    finally:
        consumer.close()


def test_unknown_task_names_pass_with_allow_unknown_tasks(app: Hurtle) -> None:
    asgi = create_app(app, token="", allow_unknown_tasks=True)
    with TestClient(asgi, base_url="http://127.0.0.1") as client:
        other = client.post(
            "/api/queues/default/messages", json={"task": "billing.Charge", "args": [1, 2, 3]}
        )
        known = client.post("/api/queues/default/messages", json={"task": "tasks.add"})
    assert other.status_code == 201, other.text
    assert known.status_code == 400 and "tasks.add(x, y)" in known.json()["error"]
    assert app.broker.stats(["default"])["default"].ready == 1


def test_a_dashboard_made_from_a_broker_needs_allow_unknown_tasks_to_enqueue(url: str) -> None:
    broker = make_broker(url)
    try:
        with TestClient(create_app(broker, token=""), base_url="http://127.0.0.1") as client:
            r = client.post("/api/queues/default/messages", json={"task": "x.y"})
            assert r.status_code == 400
            assert "made from a broker" in r.json()["error"]
            assert "allow_unknown_tasks=True" in r.json()["error"]
        asgi = create_app(broker, token="", allow_unknown_tasks=True)
        with TestClient(asgi, base_url="http://127.0.0.1") as client:
            r = client.post("/api/queues/default/messages", json={"task": "x.y"})
            assert r.status_code == 201, r.text
    finally:
        broker.close()


def _readme_enqueue_example() -> tuple[str, dict[str, Any]]:
    """The queue and body of the documentation's HTTP enqueue example (docs/dashboard.md)."""
    dashboard = (ROOT / "docs" / "dashboard.md").read_text()
    start = dashboard.index("`POST /api/queues/{queue}/messages` and `") + len(
        "`POST /api/queues/{queue}/messages` and `"
    )
    body = json.loads(dashboard[start : dashboard.index("`", start)])
    return "default", body


def test_the_documented_enqueue_example_runs_on_a_worker_of_the_readme_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n# tasks.py\n") + len("```python\n")
    (tmp_path / "tasks.py").write_text(text[start : text.index("```", start)])
    monkeypatch.setenv("HURTLE_BROKER_URL", f"sqlite:///{tmp_path / 'hurtle.db'}")
    spec = importlib.util.spec_from_file_location("tasks", tmp_path / "tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tasks", module)
    spec.loader.exec_module(module)
    app: Hurtle = module.app
    queue, body = _readme_enqueue_example()
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        r = client.post(f"/api/queues/{queue}/messages", json=body)
    assert r.status_code == 201, r.text
    worker = app.worker(queues=[queue])
    thread = worker.run_in_thread()
    try:
        wait_for(lambda: app.broker.stats([queue])[queue] in (QueueStats(), QueueStats(dead=1)))
    finally:
        worker.stop()
        thread.join(30)
    assert app.broker.stats([queue])[queue].dead == 0, app.broker.dead_letters(queue)
    app.close()
