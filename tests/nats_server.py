"""A private ``nats-server -js`` for the tests that run on NATS, and its fixtures.

Test modules that need it import the fixtures (``from nats_server import nats_server, nats_url``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from helpers import free_port


class NatsServer:
    """``nats-server -js`` on a free loopback port, its store in a directory of its own.

    ``config``: lines of a configuration file the server reads (``-c``), for TLS or
    authorization; ``name``, ``cluster`` (this server's cluster port) and ``routes`` (every
    server's cluster port) make it a member of a cluster named ``hurtle-test``."""

    def __init__(
        self,
        workdir: Path,
        *,
        config: str = "",
        name: str = "",
        cluster: int = 0,
        routes: Sequence[int] = (),
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.config = config
        self.name = name
        self.cluster = cluster
        self.routes = list(routes)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin")
        if binary is None:
            pytest.skip("nats-server is not installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.workdir)]
        if self.config:
            (self.workdir / "nats.conf").write_text(self.config)
            args += ["-c", str(self.workdir / "nats.conf")]
        if self.name:
            args += ["-n", self.name]
        if self.cluster:
            routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)
            args += ["--cluster_name", "hurtle-test", "--cluster"]
            args += [f"nats://127.0.0.1:{self.cluster}", "--routes", routes]
        with open(self.workdir / "nats.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log_text = (self.workdir / "nats.log").read_text()[-2000:]
                raise RuntimeError(f"nats-server exited at its start:\n{log_text}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if s.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: the server stops at once, whatever it was doing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

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


class NatsCluster:
    """Three ``nats-server -js`` on loopback, routed to each other as the cluster
    ``hurtle-test``, each with its own port, cluster port and store directory."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        cluster_ports = [free_port() for _ in range(size)]
        self.servers = [
            NatsServer(workdir / f"n{i}", name=f"n{i}", cluster=port, routes=cluster_ports)
            for i, port in enumerate(cluster_ports)
        ]

    @property
    def url(self) -> str:
        """Every server, comma-separated: a client reaches one and fails over to the others."""
        return "nats://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self.wait_ready()

    def wait_ready(self, timeout: float = 30) -> None:
        """Until JetStream answers on every live server (a meta leader is elected)."""
        nats = pytest.importorskip("nats")
        import asyncio

        async def ready(url: str) -> bool:
            try:
                nc = await nats.connect(url, allow_reconnect=False, connect_timeout=1)
            except Exception:
                return False
            try:
                await nc.jetstream().account_info()
                return True
            except Exception:
                return False
            finally:
                await nc.close()

        async def placed(url: str, replicas: int) -> bool:
            """Whether a stream of ``replicas`` copies can be made (every server has joined
            the JetStream meta group)."""
            from nats.js import api

            try:
                nc = await nats.connect(url, allow_reconnect=False, connect_timeout=1)
            except Exception:
                return False
            try:
                js = nc.jetstream()
                config = api.StreamConfig(name="PROBE", subjects=["probe"], num_replicas=replicas)
                await js.add_stream(config)
                await js.delete_stream("PROBE")
                return True
            except Exception:
                return False
            finally:
                await nc.close()

        deadline = time.monotonic() + timeout
        live = [s for s in self.servers if s.proc is not None and s.proc.poll() is None]
        for server in live:
            while not asyncio.run(ready(server.url)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream is not ready on {server.url}")
                time.sleep(0.2)
        if len(live) == len(self.servers):
            while not asyncio.run(placed(live[0].url, len(live))):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster cannot place a stream on every server")
                time.sleep(0.2)

    def leader(self, stream: str) -> NatsServer | None:
        """The server that leads ``stream`` now, or None while it has none."""
        nats = pytest.importorskip("nats")
        import asyncio

        async def ask() -> str | None:
            for server in self.servers:
                if server.proc is None or server.proc.poll() is not None:
                    continue
                try:
                    nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=1)
                except Exception:
                    continue
                try:
                    info = await nc.jetstream().stream_info(stream)
                    return info.cluster.leader if info.cluster else None
                except Exception:
                    continue
                finally:
                    await nc.close()
            return None

        name = asyncio.run(ask())
        return next((s for s in self.servers if s.name == name), None)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A cluster of three servers of its own for one test (its servers get killed)."""
    cluster = NatsCluster(tmp_path / "nats-cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def make_operator(where: Path) -> tuple[str, Path]:
    """An operator (JWT) setup made with the ``nkeys`` package, as ``nsc`` would make it: the
    lines of a server configuration that trusts a new operator and preloads its account (with
    JetStream) and a system account, and a ``.creds`` file of a user of that account."""
    nkeys = pytest.importorskip("nkeys")
    import base64
    import hashlib
    import json
    import os

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def keys(prefix: int) -> tuple[bytes, object, str]:
        seed = nkeys.encode_seed(os.urandom(32), prefix)
        pair = nkeys.from_seed(bytearray(seed))
        return seed, pair, pair.public_key.decode()

    def jwt(
        issuer: object, issuer_key: str, subject: str, name: str, nats: dict[str, object]
    ) -> str:
        claims: dict[str, object] = {
            "iat": int(time.time()),
            "iss": issuer_key,
            "name": name,
            "sub": subject,
            "nats": {**nats, "version": 2},
        }
        digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
        claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
        head = b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
        body = b64(json.dumps(claims).encode())
        signature = issuer.sign(f"{head}.{body}".encode())  # type: ignore[attr-defined]
        return f"{head}.{body}.{b64(signature)}"

    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1}
    unlimited |= {"wildcards": True, "conn": -1, "leaf": -1}
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    _, operator, operator_key = keys(nkeys.PREFIX_BYTE_OPERATOR)
    _, account, account_key = keys(nkeys.PREFIX_BYTE_ACCOUNT)
    _, _, system_key = keys(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, _, user_key = keys(nkeys.PREFIX_BYTE_USER)
    where.mkdir(parents=True, exist_ok=True)
    (where / "operator.jwt").write_text(
        jwt(operator, operator_key, operator_key, "hurtle-test", {"type": "operator"})
    )
    limits = {**unlimited, **jetstream}
    app = jwt(operator, operator_key, account_key, "app", {"limits": limits, "type": "account"})
    system = jwt(
        operator, operator_key, system_key, "SYS", {"limits": unlimited, "type": "account"}
    )
    allowed = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user"}
    user = jwt(account, account_key, user_key, "hurtle", allowed)
    creds = where / "user.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed.decode()}\n------END USER NKEY SEED------\n"
    )
    creds.chmod(0o600)
    config = f"""
    operator: "{where / "operator.jwt"}"
    system_account: {system_key}
    resolver: MEMORY
    resolver_preload: {{
      {account_key}: "{app}"
      {system_key}: "{system}"
    }}
    """
    return config, creds
