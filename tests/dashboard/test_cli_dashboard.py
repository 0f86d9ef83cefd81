"""``hurtle dashboard``: where it listens, and what it refuses."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import Project, free_port

pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")

TASKS = "from hurtle import Hurtle\napp = Hurtle()\n"


def test_an_off_loopback_start_without_a_token_is_refused(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, [])
    out = project.hurtle(
        "dashboard",
        "tasks:app",
        "--host",
        "0.0.0.0",
        "--port",
        str(free_port()),
        HURTLE_DASHBOARD_TOKEN="",
    )
    assert out.returncode == 2
    assert "refusing to serve the dashboard on '0.0.0.0' without an access token" in out.stderr
    assert "HURTLE_DASHBOARD_TOKEN" in out.stderr


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_with_a_token_it_serves_off_loopback_and_asks_for_the_token(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, [])
    port = free_port()
    proc = project.popen(
        "dashboard",
        "tasks:app",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        HURTLE_DASHBOARD_TOKEN="tok-123-long-enough-to-pass",
    )
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        assert proc.poll() is None, project.output(proc)
        url = f"http://127.0.0.1:{port}/api/queues"
        assert _get(url) == 401
        assert _get(url, "tok-123-long-enough-to-pass") == 200
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
