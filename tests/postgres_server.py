"""PostgreSQL for the tests: a database of this test session's own on the server the machine runs
(``HURTLE_TEST_POSTGRES``, by default ``postgresql://postgres@127.0.0.1:5432/postgres``, trust
authentication), dropped at the end; a private server (``initdb`` + ``pg_ctl`` on a free port)
when that one cannot be reached, and for the tests that kill or restart a server.

Each test gets a schema of its own in the session's database (``?schema=``), so tests never see
each other's tables, whatever pytest-xdist runs beside them.

Test modules that need it import the fixtures (``from postgres_server import postgres_url``).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import free_port

SHARED = os.environ.get("HURTLE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
_schemas = itertools.count()


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        pytest.fail(f"{name} is not installed: apt-get install postgresql")
    return found[-1]


def _as_owner(args: list[str]) -> list[str]:
    """``args`` run as the ``postgres`` OS user when we are root (the server refuses root)."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PostgresServer:
    """A private PostgreSQL server on a free loopback port, its data in a directory of its own
    (owned by the ``postgres`` OS user when the tests run as root)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hurtle-pg-"))
        self.data = self.dir / "data"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(
            _as_owner([_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]),
            check=True,
            capture_output=True,
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            _as_owner(
                [
                    _bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.dir / "log"),
                    "-o",
                    options,
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend: a crash, not a shutdown."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)
        (self.data / "postmaster.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        subprocess.run(
            _as_owner([_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
            check=False,
            capture_output=True,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _reachable(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _with_database(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    base = base.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """The URL of a server the session may make databases on (the machine's, else a private
    one)."""
    if _reachable(SHARED):
        yield SHARED
        return
    server = PostgresServer()
    server.start()
    try:
        yield server.url
    finally:
        server.remove()


@pytest.fixture(scope="session")
def postgres_database(postgres_server_url: str) -> Iterator[str]:
    """A database of this session's own (named with the xdist worker and the pid), dropped at
    the end whatever connections are left."""
    import psycopg

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"hurtle_test_{worker}_{os.getpid()}"
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(postgres_server_url, name)
    finally:
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_database: str) -> str:
    """A broker URL whose schema no other test uses."""
    return f"{postgres_database}?schema=t{next(_schemas)}"


@pytest.fixture
def postgres_private() -> Iterator[PostgresServer]:
    """A private server of this test's own, started; stopped and removed after."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()
