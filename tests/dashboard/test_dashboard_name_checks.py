"""The HTTP API refuses a bad queue or task name with 400 and changes nothing: on SQLite, and on
Redis Cluster, where a queue named ``}x`` once broke its hash tag and every later queue list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from hurtle import Hurtle
from hurtle.brokers.keys import QUEUES
from hurtle.dashboard import create_app
from hurtle.names import MAX_TASK_NAME

BAD = ["}x", "a b", "{x}", "x" * 101, "a*"]


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Hurtle]:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")
    app.task(name="add", queue="math")(lambda a, b: a + b)
    yield app
    app.close()


@pytest.mark.parametrize("queue", BAD)
def test_every_queue_route_answers_400_for_a_bad_queue_name(app: Hurtle, queue: str) -> None:
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        path = f"/api/queues/{queue}"
        answers = [
            client.post(f"{path}/messages", json={"task": "add", "args": [1, 2]}),
            client.delete(f"{path}/messages"),
            client.post(f"{path}/pause"),
            client.post(f"{path}/resume"),
            client.get(f"{path}/dead"),
            client.delete(f"{path}/dead"),
            client.post(f"{path}/dead/retry", json={"all": True}),
            client.post(f"{path}/dead/delete", json={"all": True}),
        ]
        for answer in answers:
            assert answer.status_code == 400, (answer.request.method, answer.request.url)
            assert "queue name" in answer.json()["error"]
            assert "A-Z a-z 0-9 . _ : -" in answer.json()["error"]
        assert client.get("/api/queues").status_code == 200
    assert queue not in app.broker.queues()
    assert app.broker.paused() == set()


def test_enqueue_refuses_a_task_name_beyond_the_limit(app: Hurtle) -> None:
    asgi = create_app(app, token="", allow_unknown_tasks=True)  # the length, not the name, refused
    with TestClient(asgi, base_url="http://127.0.0.1") as client:
        long = client.post("/api/queues/math/messages", json={"task": "t" * 1_000_000})
        assert long.status_code == 400
        assert f"at most {MAX_TASK_NAME}" in long.json()["error"]
        at_limit = client.post("/api/queues/math/messages", json={"task": "t" * MAX_TASK_NAME})
        assert at_limit.status_code == 201
    assert app.broker.stats(["math"])["math"].ready == 1


def test_a_hash_tag_breaking_queue_name_leaves_redis_cluster_queue_lists_working(
    redis_cluster_url: str,
) -> None:
    app = Hurtle(redis_cluster_url)
    try:
        with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
            refused = client.post("/api/queues/}x/messages", json={"task": "add"})
            assert refused.status_code == 400, refused.text
            assert client.post("/api/queues/}x/pause").status_code == 400
            listed = client.get("/api/queues")
            assert listed.status_code == 200, listed.text
            assert "}x" not in [row["name"] for row in listed.json()]
            # a name an older version let in is left out of the lists, not counted (it cannot be)
            import redis

            with redis.RedisCluster.from_url(redis_cluster_url.replace("+cluster", "")) as r:
                r.sadd(QUEUES, "}x")
            listed = client.get("/api/queues")
            assert listed.status_code == 200, listed.text
            assert "}x" not in [row["name"] for row in listed.json()]
            assert client.get("/api/overview").status_code == 200
    finally:
        app.close()
