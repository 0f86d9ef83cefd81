"""The Redis index of dead letters by message id (``hurtle:dead:index``) holds an entry per
dead letter there is — no more — on one server, where the queue scripts keep it, and on a
cluster, where their callers apply what the scripts hand back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

import redis
from hurtle.brokers import Broker, make_broker
from hurtle.brokers.keys import DEAD_INDEX
from hurtle.ids import new_id
from hurtle.message import Message


@pytest.fixture(params=["redis", "redis-cluster"])
def url(request: pytest.FixtureRequest) -> str:
    name = "redis_url" if request.param == "redis" else "redis_cluster_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def broker(url: str) -> Iterator[Broker]:
    b = make_broker(url, dead_letter_max=3, heartbeat_timeout=0.2)
    yield b
    b.close()


def index_size(url: str) -> int:
    if "+cluster" in url:
        from redis.cluster import RedisCluster

        cluster = RedisCluster.from_url(url.replace("redis+cluster", "redis"))
        try:
            return int(cluster.hlen(DEAD_INDEX))
        finally:
            cluster.close()
    client = redis.Redis.from_url(url)
    try:
        return int(client.hlen(DEAD_INDEX))
    finally:
        client.close()


def test_the_index_keeps_an_entry_per_dead_letter_through_trims_deletes_and_purges(
    broker: Broker, url: str
) -> None:
    for queue, n in (("q", 8), ("other", 2)):
        broker.publish([Message(id=new_id(), task="t", queue=queue) for _ in range(n)])
        c = broker.consumer([queue])
        for d in c.fetch(n, 1):
            c.dead_letter(d, "failed")  # past the cap of 3, each write drops the oldest
    assert index_size(url) == 3 + 2
    first = broker.dead_letters("q")[0]
    assert broker.delete_dead("q", [first.id]) == 1
    assert broker.purge_dead("other") == 2
    assert index_size(url) == 2
    assert broker.retry_dead("q") == 2
    assert index_size(url) == 0
