"""Adaptive rate limits end to end: tasks that raise ``Throttle`` when a service answers 429 cut
their key's rate for every worker, and the rate climbs back (memory broker, two workers)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import hurtle
from hurtle import ConfigurationError, Hurtle, Throttle
from hurtle.adaptive import decode


class RateLimitedService:
    """A local HTTP server that answers 429 (``Retry-After: 1``) to the requests beyond
    ``rate`` in each second, and 200 to the others; it records (time, status) of each."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.log: list[tuple[float, int]] = []
        self._second = 0
        self._count = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status = service.answer()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self) -> int:
        now = time.monotonic()
        with self.lock:
            second = int(now)
            if second != self._second:
                self._second, self._count = second, 0
            self._count += 1
            status = 200 if self._count <= self.rate else 429
            self.log.append((now, status))
        return status


@pytest.fixture
def service() -> Iterator[RateLimitedService]:
    svc = RateLimitedService(rate=40)
    svc.thread.start()
    yield svc
    svc.server.shutdown()
    svc.server.server_close()


def _call(url: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=10):
            pass
    except urllib.error.HTTPError as err:
        err.close()  # its connection; its status and headers stay readable
        if err.code == 429:
            raise Throttle(retry_after=float(err.headers.get("Retry-After", "1"))) from err
        raise


def _run_workers(app: Hurtle, done: Any, n: int, timeout: float) -> None:
    workers = [app.worker(pool="threads", concurrency=4) for _ in range(n)]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        time.sleep(0.05)
    for w in workers:
        w.stop()
    for t in threads:
        t.join(20)


@pytest.mark.parametrize("keyed", [False, True], ids=["task-limit", "keyed-limit"])
def test_429s_stop_and_the_rate_settles_near_the_service_rate(
    service: RateLimitedService, keyed: bool
) -> None:
    app = Hurtle("memory://")
    total = 600
    finished: dict[int, int] = {}  # call -> the attempt it ended on
    lock = threading.Lock()
    # ten times what the service takes; keyed, one key for all calls (the per-job path)
    options: dict[str, Any] = {"rate_key": lambda i: "svc"} if keyed else {}
    key_suffix = ":svc" if keyed else ""

    @app.task(rate_limit="400/s", retries=0, rate_limit_key=options.get("rate_key"))
    def fetch(i: int) -> None:
        _call(service.url)
        with lock:
            finished[i] = hurtle.current().attempt

    fetch.send_many([(i,) for i in range(total)])
    _run_workers(app, lambda: len(finished) == total, n=2, timeout=120)

    assert sorted(finished) == list(range(total))  # every call ran to success
    assert set(finished.values()) == {0}  # on its first attempt: a 429 spent none
    assert app.broker.dead_letters("default") == []
    log = sorted(service.log)
    oks = [t for t, status in log if status == 200]
    start, end = log[0][0], oks[int(0.9 * total)]  # while a backlog was still waiting
    steady = [(t, s) for t, s in log if start + (end - start) / 2 <= t <= end]
    throttled = sum(1 for _, s in steady if s == 429)
    achieved = sum(1 for _, s in steady if s == 200) / (steady[-1][0] - steady[0][0])
    first = [(t, s) for t, s in log if t <= start + 1.0]
    # the first second, at the configured rate, meets many 429s; later they are rare
    assert sum(1 for _, s in first if s == 429) >= 5
    assert throttled <= 0.15 * len(steady), (throttled, len(steady))
    # the rate settles near the service's 40/s, far below the configured 400/s
    assert 0.3 * service.rate <= achieved <= 1.25 * service.rate, achieved
    found = app.broker.get_rate_cuts([fetch.name + key_suffix])[0]
    assert decode(found) is not None  # shared, in the broker


def test_a_throttle_cuts_the_rate_recorded_in_the_broker_for_its_key_only() -> None:
    app = Hurtle("memory://")
    seen: list[str] = []

    @app.task(rate_limit="100/s", rate_limit_key=lambda who: who, retries=0)
    def f(who: str) -> None:
        seen.append(who)
        if who == "busy" and seen.count("busy") == 1:
            raise Throttle(retry_after=0.1)

    f.send("busy")
    f.send("calm")
    app.worker(burst=True).run()
    assert sorted(seen) == ["busy", "busy", "calm"]  # put back and run again
    busy, calm = app.broker.get_rate_cuts([f"{f.name}:busy", f"{f.name}:calm"])
    cut = decode(busy)
    assert cut is not None and cut.share == 0.5 and calm is None
    assert app.broker.dead_letters("default") == []


def test_a_task_without_a_rate_limit_that_throttles_is_only_put_back() -> None:
    app = Hurtle("memory://")
    attempts: list[int] = []

    @app.task(retries=0)
    def g() -> None:
        attempts.append(hurtle.current().attempt)
        if len(attempts) < 3:
            raise Throttle(retry_after=0)

    g.send()
    app.worker(burst=True).run()
    assert attempts == [0, 0, 0]  # no attempt spent, no dead letter
    assert app.broker.dead_letters("default") == []
    assert app.broker.get_rate_cuts([g.name]) == [None]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "5", True])
def test_throttle_refuses_a_retry_after_that_is_not_seconds(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="retry_after"):
        Throttle(retry_after=bad)


def test_on_429_makes_an_http_429_raised_by_the_task_a_throttle(
    service: RateLimitedService,
) -> None:
    app = Hurtle("memory://")
    finished: dict[int, int] = {}

    @app.task(rate_limit="100/s", on_429=True, retries=0)
    def fetch(i: int) -> None:
        try:
            with urllib.request.urlopen(service.url, timeout=10):
                finished[i] = hurtle.current().attempt
        except urllib.error.HTTPError as err:  # a 429: on_429 makes it a Throttle
            err.close()  # its connection; its status and headers stay readable
            raise

    total = 3 * service.rate
    fetch.send_many([(i,) for i in range(total)])
    _run_workers(app, lambda: len(finished) == total, n=1, timeout=60)
    assert sorted(finished) == list(range(total)) and set(finished.values()) == {0}
    assert any(status == 429 for _, status in service.log)  # some were throttled
    assert app.broker.dead_letters("default") == []
    assert decode(app.broker.get_rate_cuts([fetch.name])[0]) is not None


class _Response:
    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        self.status_code = status_code
        self.headers = headers


class _ClientError(Exception):  # the shape of requests' and httpx's HTTP errors
    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(f"{status_code}")
        self.response = _Response(status_code, headers)


def test_http_429_reads_the_status_and_retry_after_of_common_http_errors() -> None:
    from email.message import Message as Headers

    from hurtle.adaptive import http_429

    headers = Headers()
    headers["Retry-After"] = "7"
    urllib_429 = urllib.error.HTTPError("http://x/", 429, "Too Many", headers, None)
    found = http_429(urllib_429)
    assert found is not None and found.retry_after == 7.0
    found = http_429(_ClientError(429, {"Retry-After": "2.5"}))
    assert found is not None and found.retry_after == 2.5
    found = http_429(_ClientError(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}))
    assert found is not None and found.retry_after == 0.0  # a date long past
    found = http_429(_ClientError(429, {}))
    assert found is not None and found.retry_after is None
    assert http_429(_ClientError(503, {"Retry-After": "2"})) is None
    assert http_429(ValueError("429")) is None


def test_on_429_takes_a_callable_and_is_checked_at_registration() -> None:
    app = Hurtle("memory://")

    @app.task(rate_limit="5/s", on_429=lambda err: 3 if isinstance(err, KeyError) else None)
    def f() -> None: ...

    assert f.limits is not None
    throttle = f.limits.throttle_of(KeyError("x"))
    assert throttle is not None and throttle.retry_after == 3
    assert f.limits.throttle_of(ValueError("x")) is None
    with pytest.raises(ConfigurationError, match="on_429 needs rate_limit"):
        app.task(on_429=True)(lambda: None)
    with pytest.raises(ConfigurationError, match="on_429 must be True"):
        app.task(rate_limit="5/s", on_429=429)(lambda: None)  # type: ignore[call-overload]
