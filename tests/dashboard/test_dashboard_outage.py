"""The dashboard while its broker does not answer (a real ``redis-server`` stopped with SIGSTOP:
its connections stay open and silent, as a host cut off from Redis sees them): every read of
the API answers within ``read_timeout`` (503, or figures read just before) instead of waiting for
the socket timeout, and the figures come back once the server answers again."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("redis")

from starlette.testclient import TestClient

from helpers import RedisServer
from hurtle import Hurtle
from hurtle.dashboard import create_app
from hurtle.errors import ConfigurationError

pytestmark = pytest.mark.timeout(60)

READS = ["/api/overview", "/api/queues", "/api/tasks", "/api/workers", "/api/delayed", "/metrics"]


@pytest.fixture
def server(make_redis_server: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    s = make_redis_server()
    yield s
    assert s.proc is not None
    os.kill(s.proc.pid, signal.SIGCONT)  # whatever the test did, so that it can be stopped


def test_reads_answer_503_in_time_while_the_broker_is_silent_then_recover(
    server: RedisServer,
) -> None:
    assert server.proc is not None
    app = Hurtle(server.url)
    app.task(name="add", queue="math")(lambda a, b: a + b)
    try:
        dashboard = create_app(app, token="", read_timeout=0.5)
        with TestClient(dashboard, base_url="http://127.0.0.1") as c:
            assert c.get("/api/overview").status_code == 200
            os.kill(server.proc.pid, signal.SIGSTOP)
            answers: list[Any] = []

            def ask(path: str) -> None:
                answers.append((path, c.get(path)))

            # every read at once, and the overview three times: the same read is shared
            threads = [threading.Thread(target=ask, args=(p,)) for p in [*READS, *READS[:1] * 2]]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert len(answers) == len(threads), "a read hung"
            for path, r in answers:  # 503, or what a read made just before (``/api/workers``)
                assert r.status_code in (200, 503), (path, r.status_code, r.text)
                if r.status_code == 503 or path == "/api/overview":
                    assert "no answer within 0.5s" in r.json()["error"], (path, r.text)
            os.kill(server.proc.pid, signal.SIGCONT)
            for path in READS:
                r = c.get(path)
                assert r.status_code == 200, (path, r.text)
    finally:
        app.close()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True])
def test_a_read_timeout_that_is_not_a_positive_number_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="read_timeout"):
        create_app(Hurtle("memory://"), token="", read_timeout=bad)  # type: ignore[arg-type]
