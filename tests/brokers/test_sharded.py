"""Sharded queues (``brokers/sharded.py``) beyond the contract they pass with every broker
(the ``sharded-*`` kinds of ``conftest.py``): where the shards of a queue land on a Redis
Cluster, one worker running a whole sharded queue, what is summed and merged across shards, and
the refusals of bad ``shards``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import redis
from hurtle import Hurtle
from hurtle.brokers import Broker, make_broker
from hurtle.brokers.sharded import ShardedBroker, shard_names
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message
from hurtle.names import check_queue_name


def msg(queue: str, *args: object, **fields: object) -> Message:
    return Message(id=new_id(), task="tests.add", queue=queue, args=args, **fields)  # type: ignore[arg-type]


def masters_of(client: redis.Redis, slots: list[int]) -> set[str]:
    """The ids of the masters serving ``slots``, by the cluster's own table (CLUSTER SLOTS)."""
    ranges = [(int(r[0]), int(r[1]), r[2][2]) for r in client.execute_command("CLUSTER SLOTS")]
    return {node for slot in slots for low, high, node in ranges if low <= slot <= high}


def test_the_four_shards_of_a_queue_land_on_more_than_one_master(redis_cluster_url: str) -> None:
    broker = ShardedBroker(make_broker(redis_cluster_url), {"emails": 4})
    try:
        broker.publish([msg("emails", i) for i in range(40)])
        port = redis_cluster_url.rsplit(":", 1)[1]
        client = redis.Redis(port=int(port))
        names = shard_names("emails", 4)
        slots = [int(client.execute_command("CLUSTER KEYSLOT", f"{{{n}}}")) for n in names]
        masters = masters_of(client, slots)
        # each shard's ready list is on the master of its slot: the queue is spread
        for name, slot in zip(names, slots, strict=True):
            (node,) = masters_of(client, [slot])
            host = redis.Redis(port=node_port(client, node))
            assert host.llen(f"hurtle:{{{name}}}:ready:0") == 10
        assert len(masters) >= 2, (names, slots)
        assert broker.stats(["emails"])["emails"].ready == 40
    finally:
        broker.close()


def node_port(client: redis.Redis, node_id: str) -> int:
    """The port of the cluster node ``node_id``."""
    for r in client.execute_command("CLUSTER SLOTS"):
        if r[2][2] == node_id:
            return int(r[2][1])
    raise AssertionError(node_id)


def test_shard_names_are_the_same_everywhere_and_never_a_users_queue() -> None:
    assert shard_names("emails", 4) == shard_names("emails", 4)
    assert len(set(shard_names("emails", 4))) == 4
    for name in shard_names("emails", 4):
        assert name.startswith("emails~")
        with pytest.raises(ConfigurationError, match="not allowed"):
            check_queue_name(name)


@pytest.mark.parametrize("url", ["sqlite", "redis-cluster"])
def test_one_worker_runs_every_message_of_a_sharded_queue(
    url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    broker_url = (
        f"sqlite:///{tmp_path / 'h.db'}"
        if url == "sqlite"
        else str(request.getfixturevalue("redis_cluster_url"))
    )
    app = Hurtle(broker_url, shards={"emails": 4}, store_results=True)
    ran: list[int] = []
    lock = threading.Lock()

    @app.task(queue="emails")
    def send(n: int) -> int:
        with lock:
            ran.append(n)
        return n * 2

    try:
        handles = send.send_many([(i,) for i in range(200)])
        per_shard = app.broker.inner.stats(shard_names("emails", 4))  # type: ignore[attr-defined]
        assert sorted(per_shard) == sorted(shard_names("emails", 4))
        assert all(s.ready > 0 for s in per_shard.values())  # every shard got some
        worker = app.worker(queues=["emails"], pool="threads", concurrency=4)
        thread = worker.run_in_thread()
        try:
            assert [h.result(timeout=30) for h in handles] == [i * 2 for i in range(200)]
        finally:
            worker.stop()
            thread.join(10)
        assert sorted(ran) == list(range(200))
        assert app.broker.stats(["emails"])["emails"].ready == 0
        assert app.broker.queues() == ["emails"]
        assert {(c.queue, c.processed) for c in app.broker.totals()} == {("emails", 200)}
    finally:
        app.close()


def test_pause_purge_and_stats_act_on_every_shard(tmp_path: Path) -> None:
    broker = ShardedBroker(make_broker(f"sqlite:///{tmp_path / 'h.db'}"), {"emails": 4})
    try:
        broker.publish([msg("emails", i) for i in range(12)])
        broker.pause("emails")
        assert broker.paused() == {"emails"}
        assert broker.stats()["emails"].paused
        assert broker.consumer(["emails"]).fetch(20, 0) == []
        assert all(
            broker.inner.stats(shard_names("emails", 4))[n].paused for n in shard_names("emails", 4)
        )
        broker.resume("emails")
        assert broker.stats(["emails"])["emails"].ready == 12
        assert broker.purge("emails") == 12
        assert broker.stats(["emails"])["emails"].ready == 0
    finally:
        broker.close()


def test_dead_letters_of_every_shard_are_merged_and_paged(tmp_path: Path) -> None:
    broker: Broker = ShardedBroker(make_broker(f"sqlite:///{tmp_path / 'h.db'}"), {"emails": 4})
    try:
        ms = [msg("emails", i) for i in range(9)]
        broker.publish(ms)
        consumer = broker.consumer(["emails"])
        got = consumer.fetch(20, 0)
        assert len(got) == 9 and {d.queue for d in got} == {"emails"}
        for i, d in enumerate(got):
            consumer.dead_letter(d, f"reason {i}")
        everything = broker.dead_letters("emails")
        assert [d.reason for d in everything] == [f"reason {i}" for i in range(9)]
        assert {d.queue for d in everything} == {"emails"}
        assert sorted(d.raw for d in everything) == sorted(m.encode() for m in ms)
        assert broker.dead_letters("emails", limit=3, offset=2) == everything[2:5]
        assert broker.stats(["emails"])["emails"].dead == 9
        assert broker.retry_dead("emails") == 9
        assert broker.stats(["emails"])["emails"].ready == 9
    finally:
        broker.close()


@pytest.mark.parametrize(
    ("shards", "named"),
    [
        ({"emails": 0}, "shards['emails'] is 0"),
        ({"emails": True}, "shards['emails'] is True"),
        ({"emails": 2.0}, "shards['emails'] is 2.0"),
        ({"emails": 5000}, "from 1 to 1024"),
        ({"bad name": 2}, "not allowed"),
        (["emails"], "must be a dict"),
    ],
)
def test_bad_shards_are_refused_when_the_app_is_made(shards: object, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Hurtle("memory://", shards=shards)  # type: ignore[arg-type]


def test_what_was_sent_unsharded_is_counted_read_and_retried_into_the_shards(
    tmp_path: Path,
) -> None:
    inner = make_broker(f"sqlite:///{tmp_path / 'h.db'}")
    broker = ShardedBroker(inner, {"emails": 4})
    try:
        old = msg("emails", 1)
        inner.publish([old])  # a sender that was not told of the shards
        broker.publish([msg("emails", i) for i in range(8)])
        assert broker.stats(["emails"])["emails"].ready == 9
        consumer = broker.consumer(["emails"])
        got = consumer.fetch(20, 0)
        assert len(got) == 9 and got[-1].raw == old.encode()  # the plain queue is read last
        consumer.retry(got[-1], Message.decode(got[-1].raw))
        assert inner.stats(["emails"])["emails"].ready == 0  # retried into a shard
        assert sum(s.ready for s in inner.stats(shard_names("emails", 4)).values()) == 1
        assert broker.purge("emails") == 1
    finally:
        broker.close()


def test_shards_named_twice_must_agree() -> None:
    given = ShardedBroker(make_broker("memory://"), {"emails": 4})
    assert Hurtle(given, shards={"emails": 4}).broker is given
    assert Hurtle(given).shards == {"emails": 4}
    with pytest.raises(ConfigurationError, match="disagrees with the shards"):
        Hurtle(given, shards={"emails": 8})


def test_publish_once_of_a_sharded_queue_skips_ids_it_stored(redis_cluster_url: str) -> None:
    broker = ShardedBroker(make_broker(redis_cluster_url), {"emails": 4})
    try:
        messages = [msg("emails", i) for i in range(30)]
        broker.publish_once(messages[:20])
        broker.publish_once(messages)  # the first 20 again (the relay), and 10 new
        assert broker.stats(["emails"])["emails"].ready == 30
        per_shard = broker.inner.stats(shard_names("emails", 4))
        assert sum(1 for s in per_shard.values() if s.ready) > 1  # spread by id
        got = broker.consumer(["emails"]).fetch(50, 0)
        assert sorted(d.raw for d in got) == sorted(m.encode() for m in messages)
    finally:
        broker.close()
