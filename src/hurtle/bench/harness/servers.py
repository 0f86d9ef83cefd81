"""The servers a benchmark runs against: a throwaway ``redis-server`` or ``nats-server`` (free
port, temp dir, no persistence), the one-or-given Redis of a run, and emptying a store between
rows."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import ConfigurationError
from .processes import answers, stop, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """Starts ``redis-server`` on 127.0.0.1 with no RDB and no AOF; ``stop()`` removes it all."""

    def __init__(self, binary: str = "redis-server") -> None:
        path = shutil.which(binary)
        if path is None:
            raise ConfigurationError(
                f"{binary} is not on PATH: install Redis (apt-get install redis-server) "
                "or pass --redis-url"
            )
        self.port = free_port()
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
