"""Headless Chromium as the attacker: a page of another site framing the dashboard, a page whose
name resolves to 127.0.0.1 (DNS rebinding) calling its API, a stray click on a Delete button;
and the dashboard's own pages under its Content-Security-Policy. The dashboard is the real
server (``hurtle dashboard`` in a subprocess, no token, on loopback) over a SQLite broker.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import Project, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402
from playwright.sync_api import Error as PlaywrightError  # noqa: E402

#: The attacker's name; Chromium resolves it to 127.0.0.1, as a rebinding DNS server would.
ATTACKER = "attacker.example"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1",
]
TASKS = "from hurtle import Hurtle\n\napp = Hurtle()\n"

pytestmark = pytest.mark.timeout(180)


def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.05)
    return value


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path, TASKS, ["work"])


@pytest.fixture
def port(project: Project) -> Iterator[int]:
    """The dashboard's port: ``hurtle dashboard`` without a token, on 127.0.0.1."""
    port = free_port()
    proc = project.popen("dashboard", "tasks:app", "--port", str(port), HURTLE_DASHBOARD_TOKEN="")
    try:
        wait_for(lambda: _listening(port) or proc.poll() is not None, 30, "the dashboard")
        assert proc.poll() is None, project.output(proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Page:
    return browser.new_page(viewport={"width": 1280, "height": 900})


@pytest.fixture
def attacker_site(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """Another site (another origin): a directory served on its own port, as ATTACKER."""
    site = tmp_path / "site"
    site.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def make_dead_letter(project: Project, n: int = 1) -> None:
    """Dead letters in queue ``default``, made as a worker makes them."""
    broker = project.app.broker
    project.send_many("work", [(i,) for i in range(n)])
    consumer = broker.consumer(["default"])
    try:
        deliveries = consumer.fetch(n, 5.0)
        assert len(deliveries) == n
        consumer.dead_letter_many([(d, "failed in a test") for d in deliveries])
    finally:
        consumer.close()
    assert broker.stats(["default"])["default"].dead == n


def dead(project: Project) -> int:
    return project.app.broker.stats(["default"])["default"].dead


def test_a_page_of_another_site_cannot_frame_the_dashboard_and_click_delete(
    project: Project, port: int, page: Page, attacker_site: tuple[Path, int]
) -> None:
    make_dead_letter(project)
    site, site_port = attacker_site
    (site / "bait.html").write_text(
        "<!doctype html><title>Win a prize</title><h1>Click the button to win</h1>"
        f'<iframe id="victim" src="http://127.0.0.1:{port}/#/dead" width="1200" height="600">'
        "</iframe>"
    )
    page.goto(f"http://{ATTACKER}:{site_port}/bait.html")
    frame = wait_for(
        lambda: next((f for f in page.frames if f is not page.main_frame), None),
        what="the iframe",
    )
    page.wait_for_load_state("load")
    # the attacker's click lands on the framed Delete button, if the frame shows one
    with contextlib.suppress(PlaywrightError):  # refused: the frame is empty
        frame.click("button.delete-one", timeout=5000)
    assert frame.query_selector("#dead-table") is None, "the dashboard rendered in a frame"
    page.wait_for_load_state("networkidle")  # what the click sent, if anything, has landed
    assert dead(project) == 1


def test_a_rebinding_page_cannot_use_the_tokenless_dashboard(
    project: Project, port: int, page: Page
) -> None:
    # the attacker's name now resolves to 127.0.0.1: same origin as far as the browser knows
    origin = f"http://{ATTACKER}:{port}"
    answer = page.goto(origin + "/")
    assert answer is not None and answer.status == 403
    assert "127.0.0.1" in answer.text()
    script = """async ([method, path, body]) => {
        const r = await fetch(path, {method, body: body === null ? undefined : body,
            headers: body === null ? {} : {"Content-Type": "application/json"}});
        return r.status;
    }"""
    enqueue = ["POST", "/api/queues/default/messages", '{"task": "work", "args": [1]}']
    assert page.evaluate(script, enqueue) == 403
    assert page.evaluate(script, ["POST", "/api/queues/default/pause", None]) == 403
    assert page.evaluate(script, ["GET", "/api/overview", None]) == 403
    stats = project.app.broker.stats(["default"])["default"]
    assert stats.ready == 0 and not stats.paused


def test_deleting_one_dead_letter_from_the_page_asks_first(
    project: Project, port: int, page: Page
) -> None:
    make_dead_letter(project)
    answers = iter([False, True])  # first dismissed, then accepted
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        (dialog.accept if next(answers) else dialog.dismiss)()

    page.on("dialog", answer)
    page.goto(f"http://127.0.0.1:{port}/#/dead")
    wait_for(lambda: page.query_selector("#dead-table button.delete-one"), what="the row")
    page.click("#dead-table button.delete-one")
    wait_for(lambda: asked, what="the confirmation")
    assert "Delete dead letter" in asked[0] and "cannot be undone" in asked[0]
    assert dead(project) == 1  # a dismissed question sends nothing
    page.click("#dead-table button.delete-one")
    wait_for(lambda: dead(project) == 0, what="the delete after a yes")
    assert len(asked) == 2


def test_the_pages_run_under_their_content_security_policy(
    project: Project, port: int, page: Page
) -> None:
    make_dead_letter(project)
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(m.text) if m.type in ("error", "warning") else None,
    )
    page.on("pageerror", lambda e: problems.append(str(e)))
    base = f"http://127.0.0.1:{port}"
    answer = page.goto(base + "/")
    assert (
        answer is not None and "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    )
    wait_for(lambda: page.inner_text("#workers-alive") != "\u2013", what="the overview's figures")
    for name in ("queues", "workers", "dead", "scheduled", "task"):
        page.click(f"nav a[data-page={name}]")
        wait_for(lambda n=name: page.is_visible(f"section#{n}"), what=f"the {name} page")
    wait_for(lambda: page.query_selector("#dead-table button.retry-one"), what="the dead letter")
    page.goto(base + "/login")
    assert page.is_visible("input[name=token]")
    assert not [p for p in problems if "Content Security Policy" in p or "Refused" in p]
    assert not problems, problems
