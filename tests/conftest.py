"""Fixtures shared by every test: real servers on free ports, started and stopped here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import RedisClusterServer, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private Redis for the session; tests flush what they use through ``redis_url``."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    """One private Redis Cluster (three masters, three replicas) for the session."""
    pytest.importorskip("redis")
    cluster = RedisClusterServer(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServer) -> str:
    """The cluster's URL, every master flushed; a test that kills a node gets a cluster of its
    own (``make_redis_cluster``) rather than this one."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def make_redis_cluster(tmp_path: Path) -> Iterator[type[RedisClusterServer]]:
    """Start a cluster of its own inside one test (to kill its nodes)."""
    started: list[RedisClusterServer] = []

    def make(**kwargs: int) -> RedisClusterServer:
        cluster = RedisClusterServer(tmp_path, **kwargs)
        started.append(cluster)
        cluster.start()
        return cluster

    yield make  # type: ignore[misc]
    for cluster in started:
        cluster.stop()


@pytest.fixture
def make_redis_server(tmp_path: Path) -> Iterator[type[RedisServer]]:
    """Start extra private servers (with AOF, to kill or restart) inside one test."""
    started: list[RedisServer] = []

    def make(**kwargs: bool) -> RedisServer:
        server = RedisServer(tmp_path, **kwargs)
        server.start()
        started.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in started:
        server.stop()
