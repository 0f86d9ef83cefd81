"""The servers a benchmark runs against: a throwaway ``redis-server``, Redis Cluster or
``nats-server`` (free ports, temp dirs, no persistence), the one-or-given Redis of a run, and
emptying a store between rows."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import ConfigurationError
from .processes import answers, stop, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose Redis Cluster bus port (+10000) is free too."""
    for _ in range(1000):
        port = free_port()
        with socket.socket() as s, contextlib.suppress(OSError):
            if port <= 55535:
                s.bind(("127.0.0.1", port + 10000))
                return port
    raise ConfigurationError("no free port pair (port, port + 10000) for a Redis Cluster node")


class RedisServer:
    """Starts ``redis-server`` on 127.0.0.1 with no RDB and no AOF; ``stop()`` removes it all."""

    def __init__(
        self, binary: str = "redis-server", *, port: int = 0, extra: Sequence[str] = ()
    ) -> None:
        path = shutil.which(binary)
        if path is None:
            raise ConfigurationError(
                f"{binary} is not on PATH: install Redis (apt-get install redis-server) "
                "or pass --redis-url"
            )
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hurtle-bench-redis-"))
        self.proc = subprocess.Popen(
            [
                path,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                "--loglevel",
                "warning",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        if not wait_until(lambda: answers(self.port, b"PING\r\n", b"+PONG"), 10.0, self.proc):
            exited = self.proc.poll()
            self.stop()
            if exited is not None:
                raise ConfigurationError(f"redis-server exited with {exited}")
            raise ConfigurationError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterServer:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each, every node a
    ``RedisServer`` with ``cluster-enabled``, joined by ``redis-cli --cluster create``; ``url``
    names its first node, ``masters`` and ``replicas`` list their ports."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        if shutil.which("redis-cli") is None:
            raise ConfigurationError("redis-cli is not on PATH: install Redis (redis-tools)")
        self.nodes: list[RedisServer] = []
        cluster = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        try:
            for _ in range(masters * (1 + replicas)):
                self.nodes.append(RedisServer(port=free_cluster_port(), extra=cluster))
            ports = [str(n.port) for n in self.nodes]
            subprocess.run(
                [
                    *("redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)),
                    *("--cluster-replicas", str(replicas), "--cluster-yes"),
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            deadline = time.monotonic() + 60
            while not all(_cluster_node_ok(n.port) for n in self.nodes):
                if time.monotonic() > deadline:
                    raise ConfigurationError("the Redis Cluster did not become ok within 60 s")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        self.url = f"redis+cluster://127.0.0.1:{self.nodes[0].port}"
        roles = {n.port: _role(n.port) for n in self.nodes}
        self.masters = sorted(p for p, r in roles.items() if r == "master")
        self.replicas = sorted(p for p, r in roles.items() if r != "master")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _role(port: int) -> str:
    import redis

    return str(redis.Redis(port=port, decode_responses=True).info("replication")["role"])


def _cluster_node_ok(port: int) -> bool:
    """Whether the node at ``port`` sees every slot served, and (a replica) is in sync."""
    import redis

    client = redis.Redis(port=port, decode_responses=True)
    info, replication = client.cluster("info"), client.info("replication")
    client.close()
    return bool(
        info.get("cluster_state") == "ok"
        and int(info["cluster_slots_ok"]) == 16384
        and (replication["role"] == "master" or replication.get("master_link_status") == "up")
    )


class NatsServer:
    """A private ``nats-server`` on a free port of 127.0.0.1 (core NATS, no JetStream)."""

    def __init__(self, binary: str = "nats-server") -> None:
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [shutil.which(binary) or binary, "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_until(lambda: answers(self.port), 10.0, self.proc):
            self.stop()
            raise ConfigurationError(f"nats-server did not answer on port {self.port}")

    def stop(self) -> None:
        stop(self.proc)


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    """The Redis URL of a run: ``given`` (``--redis-url``) as it is, or a ``RedisServer``
    started now and stopped when the block ends."""
    if given:
        yield given
        return
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.stop()


def flush_redis(url: str) -> None:
    """Empty the database of ``url``."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def flush_cluster(url: str) -> None:
    """Empty every master of the Redis Cluster of ``url`` (``redis+cluster://…``)."""
    from redis.cluster import RedisCluster

    parts = urlsplit(url)
    plain = parts._replace(scheme=parts.scheme.split("+")[0], query="").geturl()
    cluster = RedisCluster.from_url(plain)
    cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
    cluster.close()


def flush_nats(url: str) -> None:
    """Delete every stream of the NATS server of ``url`` (queues, buckets, raw loops')."""
    import nats

    async def clear() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(str(info.config.name))
        await nc.close()

    asyncio.run(clear())


#: The schema the hurtle rows on PostgreSQL use (the raw loop uses ``bench_raw``).
POSTGRES_SCHEMA = "bench"
#: Every schema a PostgreSQL row of ``hurtle bench tasks`` writes to, all dropped before each
#: such row: hurtle's, the raw psycopg loop's, PgQueuer's and Procrastinate's.
POSTGRES_SCHEMAS = (POSTGRES_SCHEMA, "bench_raw", "bench_pgqueuer", "bench_procrastinate")


def postgres_bench_url(url: str) -> str:
    """``url`` with the hurtle rows' schema (``?schema=bench``)."""
    return f"{url}{'&' if '?' in url else '?'}schema={POSTGRES_SCHEMA}"


def flush_postgres(url: str) -> None:
    """Drop the benchmark's schemas (``POSTGRES_SCHEMAS``) from the database of ``url``: each
    row starts on new tables."""
    import psycopg

    from ...brokers.postgres.connection import parse_url

    with psycopg.connect(parse_url(url)[0], autocommit=True) as conn:
        for schema in POSTGRES_SCHEMAS:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
