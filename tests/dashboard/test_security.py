"""Attacks on the dashboard, each of which must fail: oversized and concurrent bodies, foreign
``Host`` names (DNS rebinding), deeply nested JSON, weak tokens, guessing the token, stolen or
stale session cookies, framing. Bodies are sent to the real server (``hurtle dashboard`` under
uvicorn, in a subprocess) over raw sockets; the rest goes through Starlette's test client.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import Project, free_port

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from hurtle import Hurtle
from hurtle.dashboard import create_app
from hurtle.errors import ConfigurationError

TOKEN = "s3cret-token-for-tests"
LOCAL = "http://127.0.0.1"
TASKS = """
from hurtle import Hurtle

app = Hurtle()


@app.task(name="add", retries=0)
def add(a, b):
    return a + b
"""


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)
    return value


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Hurtle]:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")
    app.task(name="add", retries=0)(lambda a, b: a + b)
    yield app
    app.broker.close()


def ready(app: Hurtle, queue: str = "default") -> int:
    return app.broker.stats([queue])[queue].ready


# -- a real server, spoken to over raw sockets ------------------------------------------------


class Served:
    """``hurtle dashboard`` in a subprocess, on loopback."""

    def __init__(self, project: Project, proc: subprocess.Popen[str], port: int) -> None:
        self.project = project
        self.proc = proc
        self.port = port

    def peak_rss(self) -> int:
        """The server's peak resident size so far, in bytes (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/<pid>/status")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def head(self, method: str, path: str, **headers: str) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_status(sock: socket.socket, timeout: float = 15) -> int:
    """The status of the answer on ``sock``; fails if none comes within ``timeout``."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            raise AssertionError(
                f"no answer within {timeout} s: the server waits for the body"
            ) from None
        if not chunk:
            raise AssertionError(f"the connection closed without an answer ({data!r})")
        data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    project = Project(tmp_path, TASKS, ["add"])
    port = free_port()
    proc = project.popen("dashboard", "tasks:app", "--port", str(port), HURTLE_DASHBOARD_TOKEN="")

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return proc.poll() is not None

    try:
        wait_for(listening, 30, "the dashboard")
        assert proc.poll() is None, project.output(proc)
        yield Served(project, proc, port)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/login", "application/x-www-form-urlencoded"),
        ("/api/queues/default/dead/retry", "application/json"),
        ("/api/queues/default/dead/delete", "application/json"),
        ("/api/queues/default/messages", "application/json"),
    ],
)
def test_a_body_declared_over_its_routes_cap_gets_413_before_it_is_sent(
    served: Served, path: str, kind: str
) -> None:
    with served.connect() as sock:
        sock.sendall(served.head("POST", path, Content_Type=kind, Content_Length=str(300_000_000)))
        assert read_status(sock) == 413  # and not a byte of the 300 MB was sent


def test_a_chunked_login_body_is_read_only_up_to_its_cap(served: Served) -> None:
    chunk = b"token=" + b"a" * (16 * 1024 - 6)
    sent = 0
    with served.connect() as sock:
        sock.sendall(
            served.head(
                "POST",
                "/login",
                Content_Type="application/x-www-form-urlencoded",
                Transfer_Encoding="chunked",
            )
        )
        while sent < 8 * 1024 * 1024:
            readable, _, _ = select.select([sock], [], [], 0.02)
            if readable:
                break
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
        assert read_status(sock) == 413
    assert sent < 1024 * 1024, f"the server read {sent} bytes of a login form"


def test_concurrent_large_bodies_are_bounded_in_total(served: Served) -> None:
    """Sixteen 15 MB enqueue bodies at once: the budget lets two in at a time, so the server's
    peak memory grows by a few bodies' worth (about 75 MB), not sixteen (about 275 MB)."""
    size = 15 * 1024 * 1024
    body = b'{"task": "", "args": ["' + b"x" * (size - 30) + b'"]}'
    statuses: list[int] = []
    before = served.peak_rss()

    def post() -> None:
        with served.connect() as sock:
            sock.sendall(
                served.head(
                    "POST",
                    "/api/queues/default/messages",
                    Content_Type="application/json",
                    Content_Length=str(len(body)),
                )
            )
            sock.sendall(body)
            statuses.append(read_status(sock, 60))

    threads = [threading.Thread(target=post) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(statuses) == [400] * 16  # each one read whole, in turn ("task" is empty)
    growth = served.peak_rss() - before
    assert growth < 150 * 1024 * 1024, f"the server grew by {growth / 2**20:.0f} MB"


def test_a_body_that_finds_the_budget_full_waits_then_gets_503() -> None:
    from hurtle.dashboard.bodies import BodyBudget, BodyLimit

    release = asyncio.Event()
    entered: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        entered.append(message["body"].decode())
        if message["body"] == b"first":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limit = BodyLimit(app, caps=[(".*", 100)], budget=BodyBudget(8, wait=0.2))

    async def call(body: bytes) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/x",
            "headers": [(b"content-length", str(len(body)).encode())],
        }
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await limit(scope, receive, send)
        return sent

    async def scenario() -> None:
        first = asyncio.create_task(call(b"first"))
        await asyncio.sleep(0)
        while not entered:
            await asyncio.sleep(0.01)
        refused = await call(b"second")  # 5 + 6 bytes > 8: it waits 0.2 s, then gives up
        assert refused[0]["status"] == 503
        assert (b"retry-after", b"1") in refused[0]["headers"]
        assert entered == ["first"]
        release.set()
        assert (await first)[0]["status"] == 200
        assert (await call(b"third"))[0]["status"] == 200  # the room came back

    asyncio.run(scenario())


# -- Host names: DNS rebinding ------------------------------------------------------------------

FOREIGN = "attacker.example:18001"


def test_without_a_token_a_foreign_host_name_is_refused(app: Hurtle) -> None:
    with TestClient(create_app(app, token=""), base_url=f"http://{FOREIGN}") as c:
        same_site = {"origin": f"http://{FOREIGN}"}
        enqueue = c.post(
            "/api/queues/default/messages", json={"task": "add", "args": [1, 2]}, headers=same_site
        )
        assert enqueue.status_code == 403 and "127.0.0.1" in enqueue.json()["error"]
        for method, path in [
            ("POST", "/api/queues/default/pause"),
            ("DELETE", "/api/queues/default/messages"),
            ("POST", "/api/queues/default/resume"),
            ("GET", "/api/overview"),
            ("GET", "/"),
            ("GET", "/metrics"),
        ]:
            assert c.request(method, path, headers=same_site).status_code == 403, path
    assert ready(app) == 0
    app.broker.pause("default")
    with TestClient(create_app(app, token=""), base_url=f"http://{FOREIGN}") as c:
        r = c.post("/api/queues/default/resume", headers={"origin": f"http://{FOREIGN}"})
        assert r.status_code == 403
    assert app.broker.paused() == {"default"}


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost", "127.0.0.1"]
)
def test_without_a_token_loopback_host_names_are_served(app: Hurtle, host: str) -> None:
    with TestClient(create_app(app, token=""), base_url=f"http://{host}") as c:
        assert c.get("/api/overview").status_code == 200
        r = c.post(
            "/api/queues/default/messages",
            json={"task": "add", "args": [1, 2]},
            headers={"origin": f"http://{host}"},
        )
        assert r.status_code == 201
    assert ready(app) == 1


def test_with_a_token_any_host_name_is_served_to_the_token(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN), base_url="http://queues.example.com") as c:
        assert c.get("/api/overview").status_code == 401
        ok = c.get("/api/overview", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


# -- malformed bodies -----------------------------------------------------------------------


def test_deeply_nested_json_is_a_400_like_any_malformed_body(app: Hurtle) -> None:
    with TestClient(create_app(app, token=""), base_url=LOCAL) as c:
        for path, body in [
            ("/api/queues/default/messages", b"[" * 2000),
            ("/api/queues/default/messages", b'{"task": "add", "args": ' + b"[" * 2000),
            ("/api/queues/default/dead/retry", b'{"ids": ' + b"[" * 2000),
            ("/api/queues/default/dead/delete", b"{" + b'"a":{' * 2000),
        ]:
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            assert "too deeply" in r.json()["error"]
    assert ready(app) == 0


# -- framing --------------------------------------------------------------------------------


def test_every_answer_forbids_framing_and_foreign_scripts(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN)) as c:
        answers = [
            c.get("/login"),
            c.get("/", follow_redirects=False),
            c.get("/api/overview"),
            c.get("/static/app.css"),
        ]
        bearer = {"authorization": f"Bearer {TOKEN}"}
        answers += [c.get(p, headers=bearer) for p in ("/", "/api/overview", "/nowhere")]
    for r in answers:
        assert r.headers["x-frame-options"] == "DENY", r.url
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, r.url
        assert r.headers["x-content-type-options"] == "nosniff"


# -- sessions ---------------------------------------------------------------------------------


def session_cookie(response: Any) -> str:
    return next(
        h for h in response.headers.get_list("set-cookie") if h.startswith("hurtle_session=")
    )


def login(c: TestClient, token: str = TOKEN) -> Any:
    return c.post("/login", data={"token": token}, follow_redirects=False)


def test_each_login_gets_its_own_random_session_that_expires(app: Hurtle) -> None:
    with (
        TestClient(create_app(app, token=TOKEN)) as a,
        TestClient(create_app(app, token=TOKEN)) as b,
    ):
        first, second = session_cookie(login(a)), session_cookie(login(b))
    value = first.split(";")[0].split("=", 1)[1]
    assert value != second.split(";")[0].split("=", 1)[1]
    fixed = hmac.new(TOKEN.encode(), b"hurtle-dashboard-session", hashlib.sha256).hexdigest()
    assert fixed not in (first, second) and TOKEN not in first
    attrs = {a.strip().split("=")[0].lower() for a in first.split(";")[1:]}
    assert {"httponly", "max-age"} <= attrs and "samesite=strict" in first.lower()


def test_a_forged_session_cookie_is_refused(app: Hurtle) -> None:
    fixed = hmac.new(TOKEN.encode(), b"hurtle-dashboard-session", hashlib.sha256).hexdigest()
    with TestClient(create_app(app, token=TOKEN), cookies={"hurtle_session": fixed}) as c:
        assert c.get("/api/overview").status_code == 401


def test_logout_ends_the_session_for_whoever_kept_its_cookie(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN)) as c:
        login(c)
        kept = c.cookies["hurtle_session"]
        assert c.get("/api/overview").status_code == 200
        out = c.post("/logout", follow_redirects=False)
        assert out.status_code == 303
        c.cookies.clear()
        c.cookies.set("hurtle_session", kept)
        assert c.get("/api/overview").status_code == 401


def test_a_session_ends_when_its_lifetime_is_over(app: Hurtle) -> None:
    dashboard = create_app(app, token=TOKEN)
    dashboard.state.dashboard.access.sessions.lifetime = 2
    with TestClient(dashboard) as c:
        login(c)
        assert c.get("/api/overview").status_code == 200
        wait_for(lambda: c.get("/api/overview").status_code == 401, 10, "the session to end")


def test_session_cookies_are_secure_over_https_and_behind_a_trusted_proxy(app: Hurtle) -> None:
    def secure(response: Any) -> bool:
        attrs = [a.strip().lower() for a in session_cookie(response).split(";")]
        return "secure" in attrs

    with TestClient(create_app(app, token=TOKEN), base_url="https://queues.example") as c:
        assert secure(login(c))
    forwarded = {"x-forwarded-proto": "https"}
    with TestClient(create_app(app, token=TOKEN)) as c:
        assert not secure(login(c))
        r = c.post("/login", data={"token": TOKEN}, headers=forwarded, follow_redirects=False)
        assert not secure(r)  # the header alone proves nothing: anyone can send it
    with TestClient(create_app(app, token=TOKEN, trust_proxy=True)) as c:
        r = c.post("/login", data={"token": TOKEN}, headers=forwarded, follow_redirects=False)
        assert secure(r)


def test_the_trusted_proxy_setting_is_read_from_the_environment(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HURTLE_DASHBOARD_TRUST_PROXY", "1")
    assert create_app(app, token=TOKEN).state.dashboard.access.trust_proxy
    monkeypatch.setenv("HURTLE_DASHBOARD_TRUST_PROXY", "maybe")
    with pytest.raises(ConfigurationError, match="HURTLE_DASHBOARD_TRUST_PROXY='maybe'"):
        create_app(app, token=TOKEN)


# -- guessing the token -------------------------------------------------------------------


def test_wrong_logins_are_throttled_per_client_even_before_the_right_one(app: Hurtle) -> None:
    from hurtle.dashboard.sessions import FREE_FAILURES

    dashboard = create_app(app, token=TOKEN)
    with TestClient(dashboard, client=("192.0.2.7", 5000)) as guesser:
        statuses = [login(guesser, f"guess-{n}").status_code for n in range(FREE_FAILURES)]
        assert statuses == [401] * FREE_FAILURES
        braked = login(guesser, f"guess-{FREE_FAILURES}")
        assert braked.status_code == 429 and int(braked.headers["retry-after"]) >= 1
        assert "try again in" in braked.text
        # while it waits, not even the right token is checked: guesses cannot go on
        assert login(guesser).status_code == 429
        bearer = guesser.get("/api/overview", headers={"authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 429
        with TestClient(dashboard, client=("192.0.2.8", 5000)) as other:
            assert login(other).status_code == 303  # another client is not held up
        # once the wait is over the right token gets in, and clears the count
        wait_for(lambda: login(guesser).status_code == 303, 10, "the wait to pass")
        assert login(guesser, "wrong again").status_code == 401


def test_bearer_token_guesses_are_throttled_like_logins(app: Hurtle) -> None:
    from hurtle.dashboard.sessions import FREE_FAILURES

    with TestClient(create_app(app, token=TOKEN)) as c:
        answers = [
            c.get("/api/overview", headers={"authorization": f"Bearer guess-{n}"}).status_code
            for n in range(FREE_FAILURES + 20)
        ]
    assert answers[:FREE_FAILURES] == [401] * FREE_FAILURES
    assert set(answers[FREE_FAILURES:]) == {429}


def test_behind_a_trusted_proxy_the_throttle_counts_the_forwarded_address(app: Hurtle) -> None:
    from hurtle.dashboard.sessions import FREE_FAILURES

    with TestClient(create_app(app, token=TOKEN, trust_proxy=True)) as c:
        one = {"x-forwarded-for": "198.51.100.1, 203.0.113.5"}
        for n in range(FREE_FAILURES):
            c.post("/login", data={"token": f"g{n}"}, headers=one)
        assert c.post("/login", data={"token": TOKEN}, headers=one).status_code == 429
        other = {"x-forwarded-for": "203.0.113.6"}
        r = c.post("/login", data={"token": TOKEN}, headers=other, follow_redirects=False)
        assert r.status_code == 303


# -- token rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [" ", "x", "short-token", " " * 20, "a token with spaces!"])
def test_a_weak_or_unusable_token_is_refused_at_start(app: Hurtle, token: str) -> None:
    with pytest.raises(ConfigurationError, match="token"):
        create_app(app, token=token)


def test_a_weak_token_in_the_environment_is_refused_at_start(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HURTLE_DASHBOARD_TOKEN", " ")
    with pytest.raises(ConfigurationError, match="HURTLE_DASHBOARD_TOKEN is 1 characters long"):
        create_app(app)


def test_a_token_read_from_a_secret_file_loses_its_trailing_newline(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HURTLE_DASHBOARD_TOKEN", TOKEN + "\n")
    with TestClient(create_app(app)) as c:
        ok = c.get("/api/overview", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert login(c).status_code == 303


def test_the_cli_refuses_a_one_space_token_off_loopback(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, [])
    port = str(free_port())
    try:
        out = project.hurtle(
            "dashboard",
            "tasks:app",
            "--host",
            "0.0.0.0",
            "--port",
            port,
            timeout=30,
            HURTLE_DASHBOARD_TOKEN=" ",
        )
    except subprocess.TimeoutExpired:
        pytest.fail("hurtle dashboard started on 0.0.0.0 with the token ' '")
    assert out.returncode == 2, out.stderr
    assert "HURTLE_DASHBOARD_TOKEN is 1 characters long" in out.stderr
    assert "at least 16" in out.stderr


# -- what a person meets ----------------------------------------------------------------------


def test_a_wrong_token_shows_the_form_again_with_a_message(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN)) as c:
        r = c.post("/login", data={"token": "<b>nope</b>"})
    assert r.status_code == 401
    assert "not this dashboard&#x27;s access token" in r.text and 'name="token"' in r.text
    assert "<b>" not in r.text


def test_the_api_index_leads_to_the_openapi_document(app: Hurtle) -> None:
    with TestClient(create_app(app, token=""), base_url=LOCAL) as c:
        r = c.get("/api/", follow_redirects=False)
        assert r.status_code in (302, 307) and r.headers["location"] == "/api/openapi.json"
        assert c.get("/api/").json()["openapi"].startswith("3.")


def test_the_favicon_is_served_even_before_login(app: Hurtle) -> None:
    with TestClient(create_app(app, token=TOKEN)) as c:
        r = c.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.content.startswith(b"<svg")
