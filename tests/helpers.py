"""Helpers for tests: private servers on free ports and the hurtle CLI in subprocesses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` on a free port, in its own directory."""

    def __init__(self, workdir: Path, *, appendonly: bool = False) -> None:
        self.workdir = workdir
        self.appendonly = appendonly
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        args = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always", "--logfile", str(self.workdir / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def hurtle_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess running hurtle from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]
    )
    env.update(extra)
    return env


def run_hurtle(*args: str, cwd: Path | None = None, timeout: float = 60, **env: str
               ) -> subprocess.CompletedProcess[str]:
    """Run the ``hurtle`` CLI in a real subprocess and capture what it prints."""
    return subprocess.run(
        [sys.executable, "-m", "hurtle", *args], cwd=cwd, env=hurtle_env(**env),
        capture_output=True, text=True, timeout=timeout, check=False,
    )
