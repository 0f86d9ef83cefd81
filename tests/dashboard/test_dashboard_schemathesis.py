"""Schemathesis against ``/api/openapi.json``: generated requests (valid ones, and ones that break
the document), with and without the access token, never get a 5xx, and every answer matches the
document (status, content type, headers, body). Stateless and bounded (a few examples per
operation), on the memory broker and a real Redis; the dashboard is made from an app (its task
names only) and with ``allow_unknown_tasks`` (so that enqueues succeed too)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.testclient import TestClient

from hurtle import Hurtle
from hurtle.brokers.memory import MemoryBroker
from hurtle.dashboard import create_app
from hurtle.dashboard.openapi import OPENAPI
from hurtle.errors import ConfigurationError

TOKEN = "schemathesis-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Generated requests per operation and configuration (about 20 s in all).
EXAMPLES = 10
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


OPERATIONS = sorted(
    op.ok().label
    for op in schemathesis.openapi.from_dict(OPENAPI).get_all_operations()
    if op.ok().path != "/api/throughput/stream"  # never ends: its own test reads one event
)


@pytest.fixture(
    params=[("memory", False), ("memory", True), ("redis", False), ("redis", True)],
    ids=["memory", "memory-unknown-tasks", "redis", "redis-unknown-tasks"],
)
def api(request: pytest.FixtureRequest) -> Iterator[schemathesis.BaseSchema]:
    kind, allow_unknown = request.param
    url = "memory://" if kind == "memory" else request.getfixturevalue("redis_url")
    app = Hurtle(url)

    @app.task(name="tasks.add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    app.tasks["tasks.add"].send_many([(1, 2), (3, 4)])  # something to list, purge, retry
    asgi = create_app(app, token=TOKEN, allow_unknown_tasks=allow_unknown)
    yield schemathesis.openapi.from_asgi("/api/openapi.json", asgi, headers=AUTH)
    app.close()


@pytest.mark.parametrize("label", OPERATIONS)
def test_the_api_answers_as_its_openapi_document_says(
    api: schemathesis.BaseSchema, label: str
) -> None:
    operation = api.find_operation_by_label(label)
    assert operation is not None
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS, headers=AUTH)

    check()


def test_a_call_the_broker_fails_answers_503_as_documented(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        app.broker.close()  # a closed SQLite broker fails every call
        for path, documented in [
            ("/api/queues", "/api/queues"),
            ("/api/overview", "/api/overview"),
            ("/api/queues/default/dead", "/api/queues/{queue}/dead"),
        ]:
            r = client.get(path)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"].startswith("the broker failed: ")
            assert "503" in OPENAPI["paths"][documented]["get"]["responses"]


class _RefusesLongNames(MemoryBroker):
    """A broker whose pause refuses names longer than 8 characters, as a store may."""

    def pause(self, queue: str) -> None:
        if len(queue) > 8:
            raise ConfigurationError(f"queue name {queue!r} is longer than 8 characters")
        super().pause(queue)


def test_a_value_the_broker_refuses_answers_400_as_documented() -> None:
    asgi = create_app(_RefusesLongNames(), token="")
    with TestClient(asgi, base_url="http://127.0.0.1") as client:
        r = client.post("/api/queues/much-too-long/pause")
        assert r.status_code == 400, r.text
        assert r.json() == {"error": "queue name 'much-too-long' is longer than 8 characters"}
        assert client.post("/api/queues/short/pause").status_code == 200
    assert "400" in OPENAPI["paths"]["/api/queues/{queue}/pause"]["post"]["responses"]
