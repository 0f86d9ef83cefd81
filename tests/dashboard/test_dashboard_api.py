"""The dashboard's JSON API, ``/metrics`` and access rules, on a real SQLite broker and a real
worker (in a thread), through Starlette's test client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("prometheus_client", reason="the dashboard extra is not installed")


from starlette.testclient import TestClient

from hurtle import Hurtle, Progress
from hurtle.brokers import StoredResult
from hurtle.dashboard import create_app
from hurtle.dashboard.batcher import Batcher
from hurtle.dashboard.openapi import OPENAPI
from hurtle.message import Message
from hurtle.progress import encode_progress

TOKEN = "s3cret-token-for-tests"
#: Without a token the dashboard answers only requests addressed to a loopback name.
LOCAL = "http://127.0.0.1"


def wait_for(predicate: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Hurtle]:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}", heartbeat_interval=0.05)

    @app.task(name="add", queue="math", retries=0)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="boom", queue="math", retries=0)
    def boom() -> None:
        raise ValueError("it broke")

    yield app
    app.broker.close()


@pytest.fixture
def client(app: Hurtle) -> Iterator[TestClient]:
    with TestClient(create_app(app, token=""), base_url=LOCAL) as c:
        yield c


def run_worker(app: Hurtle, until: Callable[[], bool]) -> None:
    worker = app.worker(queues=["math"])
    thread = worker.run_in_thread()
    try:
        wait_for(until)
    finally:
        worker.stop()
        thread.join(30)


def test_enqueue_answers_with_ids_and_the_messages_run(app: Hurtle, client: TestClient) -> None:
    one = client.post("/api/queues/math/messages", json={"task": "add", "args": [5, 6]})
    assert one.status_code == 201, one.text
    many = client.post(
        "/api/queues/math/messages",
        json=[{"task": "add", "args": [1, 2]}, {"task": "add", "args": [3, 4]}],
    )
    assert many.status_code == 201
    ids = [one.json()["id"], *many.json()["ids"]]
    assert len(set(ids)) == 3
    assert app.broker.stats(["math"])["math"].ready == 3

    run_worker(app, lambda: sum(r.total("processed") for r in app.broker.workers()) >= 3)
    assert client.get("/api/tasks").json() == [
        {
            "queue": "math",
            "task": "add",
            "processed": 3,
            "failed": 0,
            "retried": 0,
            "dead_lettered": 0,
        },
    ]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not JSON"),
        (b'{"args": [1]}', '"task"'),
        (b'{"task": "add", "args": {"a": 1}}', '"args" must be a list'),
        (b'{"task": "add", "priority": 99}', "priority"),
        (b'{"task": "add", "color": "red"}', "unknown fields"),
        (b"[]", "nothing to enqueue"),
    ],
)
def test_enqueue_refuses_bad_input_with_a_clear_message(
    app: Hurtle, client: TestClient, body: bytes, needle: str
) -> None:
    r = client.post(
        "/api/queues/math/messages", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert needle in r.json()["error"]
    assert app.broker.stats(["math"])["math"].ready == 0


def test_concurrent_enqueues_share_one_broker_call(app: Hurtle) -> None:
    batcher = Batcher(app.broker, window=0.05)

    async def main() -> None:
        await asyncio.gather(
            *(
                batcher.publish([Message(id=f"m{i}", task="add", queue="math", args=(i, i))])
                for i in range(50)
            )
        )

    asyncio.run(main())
    assert (batcher.calls, batcher.published) == (1, 50)
    assert app.broker.stats(["math"])["math"].ready == 50


def test_dead_letters_list_retry_and_delete(app: Hurtle, client: TestClient) -> None:
    app.tasks["boom"].send_many([() for _ in range(3)])
    run_worker(app, lambda: app.broker.stats(["math"])["math"].dead == 3)

    rows = client.get("/api/queues/math/dead").json()
    assert len(rows) == 3
    first = rows[0]
    assert first["task"] == "boom" and first["attempt"] == 1
    assert "no retries left" in first["reason"] and "ValueError: it broke" in first["traceback"]

    assert client.post("/api/queues/math/dead/retry", json={"ids": [first["id"]]}).json() == {
        "retried": 1
    }
    assert client.post("/api/queues/math/dead/delete", json={"ids": [rows[1]["id"]]}).json() == {
        "deleted": 1
    }
    stats = app.broker.stats(["math"])["math"]
    assert (stats.ready, stats.dead) == (1, 1)
    assert client.post("/api/queues/math/dead/retry", json={"everything": 1}).status_code == 400
    assert client.delete("/api/queues/math/dead").json() == {"purged": 1}


def test_overview_workers_and_metrics_show_what_workers_report(
    app: Hurtle, client: TestClient
) -> None:
    app.tasks["add"].send_many([(i, i) for i in range(5)])
    app.tasks["boom"].send()
    worker = app.worker(queues=["math"], pool="threads", concurrency=2)
    thread = worker.run_in_thread()
    try:
        workers = wait_for(
            lambda: [w for w in client.get("/api/workers").json() if w["processed"] == 6]
        )
        assert (workers[0]["pool"], workers[0]["concurrency"], workers[0]["failed"]) == (
            "threads",
            2,
            1,
        )
        overview = client.get("/api/overview").json()
        assert overview["workers_alive"] == 1
        assert overview["totals"] == {"processed": 6, "failed": 1, "retried": 0, "dead_lettered": 1}
        metrics = client.get("/metrics").text
    finally:
        worker.stop()
        thread.join(30)
    assert 'hurtle_tasks_processed_total{queue="math",task="add"} 5.0' in metrics
    assert 'hurtle_tasks_dead_lettered_total{queue="math",task="boom"} 1.0' in metrics
    assert 'hurtle_queue_messages{queue="math",state="dead"} 1.0' in metrics
    assert "hurtle_workers_alive 1.0" in metrics
    assert 'hurtle_task_runtime_seconds_count{queue="math",task="add"} 5.0' in metrics
    assert 'hurtle_task_runtime_seconds_bucket{le="+Inf",queue="math",task="boom"} 1.0' in metrics


def test_the_throughput_stream_sends_points(client: TestClient) -> None:
    with client.stream("GET", "/api/throughput/stream") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                point = json.loads(line[6:])
                break
    assert set(point) == {"t", "processed", "failed", "totals"}
    assert set(point["totals"]) == {"processed", "failed", "retried", "dead_lettered"}


def test_every_route_is_in_the_openapi_document(app: Hurtle, client: TestClient) -> None:
    doc = client.get("/api/openapi.json").json()
    assert doc == json.loads(json.dumps(OPENAPI))
    routes = {r.path for r in create_app(app, token="").routes if r.path.startswith("/api/")}
    assert routes - {"/api/openapi.json"} == set(doc["paths"])


# -- access -------------------------------------------------------------------------------


def test_with_a_token_a_request_without_it_gets_401(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN)) as c:
        assert c.get("/api/queues").status_code == 401
        assert c.get("/metrics").status_code == 401
        assert c.post("/api/queues/math/messages", json={"task": "add"}).status_code == 401
        assert c.get("/api/queues", headers={"authorization": "Bearer wrong"}).status_code == 401
        page = c.get("/", follow_redirects=False)
        assert (page.status_code, page.headers["location"]) == (303, "/login")
        ok = c.get("/api/queues", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
    assert app.broker.stats(["math"])["math"].ready == 0


def test_a_login_sets_an_httponly_session_and_changes_need_the_csrf_token(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN)) as c:
        bad = c.post("/login", data={"token": "nope"}, follow_redirects=False)
        assert "hurtle_session" not in bad.headers.get("set-cookie", "")
        r = c.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert r.status_code == 303
        session = next(
            h for h in r.headers.get_list("set-cookie") if h.startswith("hurtle_session=")
        )
        assert "HttpOnly" in session and TOKEN not in session
        assert c.get("/api/queues").status_code == 200  # the cookie authenticates reads

        body = {"task": "add", "args": [1, 2]}
        refused = c.post("/api/queues/math/messages", json=body)
        assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
        csrf = c.cookies["hurtle_csrf"]
        ok = c.post("/api/queues/math/messages", json=body, headers={"x-csrf-token": csrf})
        assert ok.status_code == 201


def test_a_cross_site_change_is_refused(app: Hurtle, client: TestClient) -> None:
    r = client.post(
        "/api/queues/math/messages",
        json={"task": "add"},
        headers={"origin": "https://evil.example"},
    )
    assert r.status_code == 403
    assert app.broker.stats(["math"])["math"].ready == 0


def test_answers_match_the_openapi_document(app: Hurtle, client: TestClient) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    doc = client.get("/api/openapi.json").json()

    def check(path: str, method: str, status: int, body: Any) -> None:
        schema = doc["paths"][path][method]["responses"][str(status)]["content"][
            "application/json"
        ]["schema"]
        jsonschema.validate(body, {**schema, "components": doc["components"]})

    def check_request(path: str, body: Any) -> None:
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        jsonschema.validate(body, {**schema, "components": doc["components"]})

    app.periodic(app.tasks["add"], every=60, args=(1, 1))
    mul = app.task(name="mul", queue="math", store_result=True)(lambda a, b: a * b)
    kept = mul.send(2, 3)
    enqueue = [{"task": "add", "args": [1, 2]}, {"task": "boom", "kwargs": {}}]
    check_request("/api/queues/{queue}/messages", enqueue)
    r = client.post("/api/queues/math/messages", json=enqueue)
    check("/api/queues/{queue}/messages", "post", r.status_code, r.json())
    bad = client.post("/api/queues/math/messages", json={"nope": 1})
    check("/api/queues/{queue}/messages", "post", bad.status_code, bad.json())
    run_worker(app, lambda: app.broker.stats(["math"])["math"].dead == 1)

    worker = app.worker(queues=["math"])
    thread = worker.run_in_thread()
    try:
        wait_for(lambda: client.get("/api/workers").json())
        for path in (
            "/api/overview",
            "/api/throughput",
            "/api/queues",
            "/api/tasks",
            "/api/workers",
            "/api/schedules",
            "/api/delayed",
        ):
            r = client.get(path)
            check(path, "get", r.status_code, r.json())

    finally:
        worker.stop()
        thread.join(30)
    dead = client.get("/api/queues/math/dead")
    assert dead.json()
    check("/api/queues/{queue}/dead", "get", 200, dead.json())
    # lookups of an unknown id, of a dead letter, of a stored result
    for message_id in ("no-such-id", dead.json()[0]["message_id"], kept.id):
        r = client.get(f"/api/tasks/{message_id}")
        check("/api/tasks/{id}", "get", r.status_code, r.json())
    for verb in ("retry", "delete"):
        path = f"/api/queues/{{queue}}/dead/{verb}"
        check_request(path, {"all": True})
        r = client.post(f"/api/queues/math/dead/{verb}", json={"all": True})
        check(path, "post", r.status_code, r.json())
    r = client.delete("/api/queues/math/dead")
    check("/api/queues/{queue}/dead", "delete", r.status_code, r.json())


# -- queue controls: pause, resume, purge -------------------------------------------------------


def validator(client: TestClient) -> Callable[[str, str, Any], None]:
    """Checks an answer against its schema in the OpenAPI document."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    doc = client.get("/api/openapi.json").json()

    def check(path: str, method: str, r: Any) -> None:
        schema = doc["paths"][path][method]["responses"][str(r.status_code)]["content"][
            "application/json"
        ]["schema"]
        jsonschema.validate(r.json(), {**schema, "components": doc["components"]})

    return check


def test_a_queue_is_paused_resumed_and_purged_through_the_api(
    app: Hurtle, client: TestClient
) -> None:
    check = validator(client)
    add = app.tasks["add"]
    add.send_many([(i, i) for i in range(3)])
    add.options(delay=3600).send(9, 9)
    consumer = app.broker.consumer(["math"])
    try:
        held = consumer.fetch(1, 1.0)
        assert len(held) == 1

        r = client.post("/api/queues/math/pause")
        assert (r.status_code, r.json()) == (200, {"queue": "math", "paused": True})
        check("/api/queues/{queue}/pause", "post", r)
        assert app.broker.paused() == {"math"}
        [row] = [q for q in client.get("/api/queues").json() if q["name"] == "math"]
        assert (row["paused"], row["ready"], row["delayed"], row["in_flight"]) == (True, 2, 1, 1)
        check("/api/queues", "get", client.get("/api/queues"))

        r = client.delete("/api/queues/math/messages")
        assert (r.status_code, r.json()) == (200, {"purged": 3})
        check("/api/queues/{queue}/messages", "delete", r)
        stats = app.broker.stats(["math"])["math"]
        assert (stats.ready, stats.delayed, stats.in_flight, stats.paused) == (0, 0, 1, True)
        consumer.ack(held)  # what was in flight finishes as usual

        r = client.post("/api/queues/math/resume")
        assert (r.status_code, r.json()) == (200, {"queue": "math", "paused": False})
        check("/api/queues/{queue}/resume", "post", r)
        assert app.broker.paused() == set()
        assert client.delete("/api/queues/math/messages").json() == {"purged": 0}
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/queues/math/pause"),
        ("POST", "/api/queues/math/resume"),
        ("DELETE", "/api/queues/math/messages"),
    ],
)
def test_queue_controls_need_the_token_and_with_a_cookie_the_csrf_token(
    app: Hurtle, method: str, path: str
) -> None:
    app.tasks["add"].send(1, 2)
    if path.endswith("/resume"):
        app.broker.pause("math")
    before = app.broker.stats(["math"])["math"]
    with TestClient(create_app(app, token=TOKEN)) as c:
        assert c.request(method, path).status_code == 401
        wrong = c.request(method, path, headers={"authorization": "Bearer wrong"})
        assert wrong.status_code == 401
        cross = c.request(
            method,
            path,
            headers={"authorization": f"Bearer {TOKEN}", "origin": "https://evil.example"},
        )
        assert cross.status_code == 403
        assert c.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
        refused = c.request(method, path)  # the session cookie alone: no CSRF token
        assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
        forged = c.request(method, path, headers={"x-csrf-token": "guessed"})
        assert forged.status_code == 403
        assert app.broker.stats(["math"])["math"] == before  # nothing changed so far
        ok = c.request(method, path, headers={"x-csrf-token": c.cookies["hurtle_csrf"]})
        assert ok.status_code == 200, ok.text
    after = app.broker.stats(["math"])["math"]
    if path.endswith("/pause"):
        assert (after.paused, after.ready) == (True, 1)
    elif path.endswith("/resume"):
        assert (after.paused, after.ready) == (False, 1)
    else:
        assert (after.paused, after.ready) == (False, 0)


def test_a_bearer_token_changes_a_queue_without_a_csrf_token(app: Hurtle) -> None:
    bearer = {"authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(app, token=TOKEN)) as c:
        assert c.post("/api/queues/math/pause", headers=bearer).status_code == 200
        assert app.broker.paused() == {"math"}
        assert c.post("/api/queues/math/resume", headers=bearer).status_code == 200
        assert app.broker.paused() == set()


def test_retries_are_counted_per_task(app: Hurtle, client: TestClient) -> None:
    @app.task(name="flaky", queue="math", retries=1, retry_delay=0)
    def flaky() -> None:
        raise ValueError("again")

    flaky.send()
    run_worker(
        app,
        lambda: (
            app.broker.stats(["math"])["math"].dead == 1
            and any(w.total("processed") == 2 for w in app.broker.workers())
        ),
    )
    assert client.get("/api/tasks").json() == [
        {
            "queue": "math",
            "task": "flaky",
            "processed": 2,
            "failed": 2,
            "retried": 1,
            "dead_lettered": 1,
        },
    ]


def test_an_enqueue_the_broker_fails_answers_503_and_names_the_failure(
    app: Hurtle, client: TestClient
) -> None:
    app.broker.close()
    r = client.post("/api/queues/math/messages", json={"task": "add", "args": [1, 2]})
    assert r.status_code == 503
    assert "nothing was enqueued" in r.json()["error"] and "closed" in r.json()["error"]


def test_an_oversized_enqueue_body_is_refused(app: Hurtle, client: TestClient) -> None:
    from hurtle.dashboard.web import MAX_BODY

    r = client.post(
        "/api/queues/math/messages",
        content=b"[" + b" " * MAX_BODY + b"]",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    assert app.broker.stats(["math"])["math"].ready == 0


def test_it_mounts_under_a_prefix_in_another_app(app: Hurtle) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/ops/queues", app=create_app(app, token=TOKEN))])
    with TestClient(outer) as c:
        page = c.get("/ops/queues/", follow_redirects=False)
        assert (page.status_code, page.headers["location"]) == (303, "/ops/queues/login")
        login = c.post("/ops/queues/login", data={"token": TOKEN}, follow_redirects=False)
        assert login.headers["location"] == "/ops/queues/"
        page = c.get("/ops/queues/")
        assert page.status_code == 200 and 'src="/ops/queues/static/app.js"' in page.text
        assert c.get("/ops/queues/static/app.js").status_code == 200
        r = c.post(
            "/ops/queues/api/queues/math/messages",
            json={"task": "add", "args": [1, 2]},
            headers={"x-csrf-token": c.cookies["hurtle_csrf"]},
        )
        assert r.status_code == 201, r.text
        queues = {q["name"]: q for q in c.get("/ops/queues/api/queues").json()}
        assert queues["math"]["ready"] == 1


# -- task lookup, schedules, delayed ---------------------------------------------------------


def test_a_task_lookup_shows_the_result_arguments_and_timings(
    app: Hurtle, client: TestClient
) -> None:
    @app.task(name="mul", queue="math", store_result=True)
    def mul(a: int, b: int) -> int:
        return a * b

    before = time.time()
    handle = mul.send(6, 7)
    run_worker(app, lambda: handle.state() == "succeeded")
    row = client.get(f"/api/tasks/{handle.id}").json()
    assert (row["state"], row["source"], row["result"], row["error"]) == (
        "succeeded",
        "result",
        42,
        None,
    )
    assert (row["task"], row["queue"], row["args"], row["kwargs"], row["attempt"]) == (
        "mul",
        "math",
        [6, 7],
        {},
        1,
    )
    assert row["keeps_result"] is True
    assert before <= row["enqueued_at"] <= row["started_at"] <= row["finished_at"] <= time.time()


def test_a_task_lookup_of_a_failure_shows_the_error(app: Hurtle, client: TestClient) -> None:
    @app.task(name="crash", queue="math", store_result=True, retries=0)
    def crash(x: int) -> None:
        raise KeyError(x)

    handle = crash.send(3)
    run_worker(app, lambda: handle.state() == "dead")
    row = client.get(f"/api/tasks/{handle.id}").json()
    assert (row["state"], row["args"], row["result"]) == ("dead", [3], None)
    assert row["error"]["type"] == "KeyError" and "KeyError: 3" in row["error"]["traceback"]
    assert row["dead_letter_id"] is not None  # its dead letter, for a retry from the page


def test_a_task_that_keeps_no_result_is_found_in_the_dead_letters_and_says_so(
    app: Hurtle, client: TestClient
) -> None:
    handle = app.tasks["boom"].send()
    run_worker(app, lambda: app.broker.stats(["math"])["math"].dead == 1)
    row = client.get(f"/api/tasks/{handle.id}").json()
    assert (row["state"], row["source"], row["task"], row["keeps_result"]) == (
        "dead",
        "dead_letter",
        "boom",
        False,
    )
    assert "it broke" in row["error"]["traceback"]
    assert "keeps no result" in row["note"]


def test_a_task_lookup_of_an_id_with_no_record_says_why_there_may_be_none(
    app: Hurtle, client: TestClient
) -> None:
    handle = app.tasks["add"].send(1, 2)  # waits in its queue: no worker runs
    row = client.get(f"/api/tasks/{handle.id}").json()
    assert (row["state"], row["source"], row["result"]) == ("unknown", None, None)
    assert "keep no result" in row["note"] and "No task of this app keeps results" in row["note"]


def test_a_task_lookup_shows_the_tasks_latest_progress_report(
    app: Hurtle, client: TestClient
) -> None:
    handle = app.tasks["add"].send(1, 2)  # waits in its queue: its report is put here
    report = Progress(0.4, "resized 4 of 10", time.time())
    app.broker.put_progress([StoredResult(handle.id, encode_progress(report), 60)])
    row = client.get(f"/api/tasks/{handle.id}").json()
    assert row["progress"] == {"fraction": 0.4, "message": "resized 4 of 10", "at": report.at}
    assert "reported its progress" in row["note"]
    other = client.get(f"/api/tasks/{app.tasks['add'].send(1, 1).id}").json()
    assert other["progress"] is None


def test_schedules_show_last_and_next_run_and_delayed_messages_their_count(
    app: Hurtle, client: TestClient
) -> None:
    app.periodic(app.tasks["add"], every=3600, args=(1, 1), name="hourly")
    app.tasks["add"].options(delay=600).send(2, 2)
    doc = client.get("/api/schedules").json()
    (row,) = doc["schedules"]
    assert (row["name"], row["task"], row["when"], row["last_run"]) == (
        "hourly",
        "add",
        "every 3600s",
        None,
    )
    assert row["next_run"] % 3600 == 0 and doc["time"] < row["next_run"] <= doc["time"] + 3600
    delayed = {d["queue"]: d for d in client.get("/api/delayed").json()}
    assert delayed["math"]["delayed"] == 1
    assert delayed["math"]["listed"] is True and len(delayed["math"]["next"]) == 1


def test_delayed_messages_are_listed_soonest_first_where_the_broker_can() -> None:
    app = Hurtle("memory://")
    task = app.task(name="later", queue="q")(lambda: None)
    now = time.time()
    ids = [task.options(eta=now + d).send().id for d in (300, 100, 200)]
    with TestClient(create_app(app, token=""), base_url=LOCAL) as c:
        row = {d["queue"]: d for d in c.get("/api/delayed").json()}["q"]
    assert (row["delayed"], row["listed"]) == (3, True)
    assert [n["id"] for n in row["next"]] == [ids[1], ids[2], ids[0]]
    assert {n["task"] for n in row["next"]} == {"later"}
