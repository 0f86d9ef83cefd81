"""The processes a benchmark starts: spawned in a session of their own with their output in a log
file, waited for until they listen, and stopped (SIGTERM, then SIGKILL) however they ended."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (so that ``stop_group`` reaches its children), its
    stdout and stderr going to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group ``spawn`` started, then SIGKILL whatever is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers (e.g. forked children) of this group
    proc.wait()


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM one process, then SIGKILL it if it is still there after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a log, joined with `` | ``; ``""`` if it cannot be read."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def answers(port: int, ping: bytes = b"", reply: bytes = b"") -> bool:
    """Whether something on 127.0.0.1:``port`` accepts a connection (and, given ``ping``,
    answers it with a line starting with ``reply``)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            if ping:
                s.sendall(ping)
                return s.recv(16).startswith(reply)
            return True
    except OSError:
        return False


def wait_until(ready: Callable[[], bool], timeout: float, proc: subprocess.Popen[bytes]) -> bool:
    """Poll ``ready`` until it is true (``True``), the time is up or ``proc`` exited (``False``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            return True
        time.sleep(0.05)
    return False


def output(argv: Sequence[str], timeout: float) -> str:
    """What a short command printed, stripped; ``""`` if it could not run or failed."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""
