"""A private ``nats-server -js`` for the tests that run on NATS, and its fixtures.

Test modules that need it import the fixtures (``from nats_server import nats_server, nats_url``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import free_port


class NatsServer:
    """``nats-server -js`` on a free loopback port, its store in a directory of its own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")
        if binary is None:
            pytest.skip("nats-server is not installed")
        args = [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.workdir)]
        with open(self.workdir / "nats.log", "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if s.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def clear(self) -> None:
        """Delete every stream (queues, dead letters, KV buckets): each test starts empty."""
        nats = pytest.importorskip("nats")
        import asyncio

        async def clear() -> None:
            nc = await nats.connect(self.url)
            js = nc.jetstream()
            for info in await js.streams_info():
                await js.delete_stream(info.config.name)
            await nc.close()

        asyncio.run(clear())

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    nats_server.clear()
    return nats_server.url
