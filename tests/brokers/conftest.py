"""The conformance suite runs once per broker kind; a new broker joins by adding one factory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hurtle.brokers import Broker, make_broker
from hurtle.brokers.sharded import ShardedBroker
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures
from postgres_server import (  # noqa: F401 - fixtures
    postgres_database,
    postgres_private,
    postgres_server_url,
    postgres_url,
)

BROKER_KINDS = [
    "memory",
    "sqlite",
    "redis",
    "redis-cluster",
    "nats",
    "postgres",
    "sharded-memory",
    "sharded-redis-cluster",
]
#: The sharding layer is one wrapper over any broker: by default the suite runs it over the
#: memory broker and a Redis Cluster (shards on several masters), which keeps the default run
#: short; ``HURTLE_TEST_SHARDED=all`` adds it over SQLite and one Redis.
if os.environ.get("HURTLE_TEST_SHARDED") == "all":
    BROKER_KINDS += ["sharded-sqlite", "sharded-redis"]
#: The queues a sharded kind stores sharded (``ShardedBroker``): every queue the suite's
#: consumers read, so that the whole contract holds across shards.
SHARDS = {"q": 4, "p": 3, "next": 2, "cb": 2, "a": 2, "high": 2, "empty": 2, "r": 2, "other": 2}

MakeBroker = Callable[..., Broker]


@pytest.fixture(params=BROKER_KINDS)
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param.removeprefix("sharded-")
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'hurtle.db'}"
    if kind == "redis":
        return str(request.getfixturevalue("redis_url"))
    if kind == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    if kind == "nats":
        return str(request.getfixturevalue("nats_url"))
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    raise AssertionError(kind)


def sharded(request: pytest.FixtureRequest) -> bool:
    """Whether this test runs on one of the sharded kinds."""
    callspec = getattr(request.node, "callspec", None)
    return callspec is not None and str(callspec.params.get("broker_url", "")).startswith(
        "sharded-"
    )


@pytest.fixture
def make(broker_url: str, request: pytest.FixtureRequest) -> Iterator[MakeBroker]:
    """Make brokers on one store: each call is a separate client (another 'process').

    The memory broker has no separate clients, so every call returns the same object; on a
    sharded kind, each call wraps the broker made in a ``ShardedBroker`` of ``SHARDS``.
    """
    made: list[Broker] = []
    shared: list[Broker] = []
    wrap = sharded(request)
    if wrap and request.node.get_closest_marker("ordered") is not None:
        pytest.skip("a sharded queue keeps order within each shard only (docs/brokers.md)")

    def factory(heartbeat_timeout: float = 20.0, max_recoveries: int = 3) -> Broker:
        inner = plain(heartbeat_timeout, max_recoveries)
        return ShardedBroker(inner, SHARDS) if wrap else inner

    def plain(heartbeat_timeout: float, max_recoveries: int) -> Broker:
        if broker_url.startswith("memory"):
            if not shared:
                shared.append(make_broker(broker_url, heartbeat_timeout=heartbeat_timeout))
                made.append(shared[0])
            shared[0].heartbeat_timeout = heartbeat_timeout
            shared[0].max_recoveries = max_recoveries
            return shared[0]
        b = make_broker(
            broker_url, heartbeat_timeout=heartbeat_timeout, max_recoveries=max_recoveries
        )
        made.append(b)
        return b

    yield factory
    for b in made:
        b.close()


@pytest.fixture
def broker(make: MakeBroker) -> Broker:
    return make()
