"""Redis-specific behaviour of ``RedisBroker`` that the shared conformance suite cannot see.

Everything runs against a private ``redis-server`` started by the fixtures in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from typing import Any, cast

import msgspec
import pytest

pytest.importorskip("redis")

import redis
from helpers import stored_batch
from hurtle.brokers import Delivery, QueueStats, StoredResults, make_broker
from hurtle.brokers.keys import DEAD_INDEX, QUEUES, RESULT_KEY_PREFIX, queue_keys
from hurtle.brokers.redis import RedisBroker
from hurtle.brokers.redis.scripts import RAW
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message


def msg(queue: str = "q", *args: object, priority: int = 0, eta: float = 0.0) -> Message:
    return Message(id=new_id(), task="t", queue=queue, args=args, priority=priority, eta=eta)


def numbers(deliveries: list[Delivery]) -> list[int]:
    return [int(Message.decode(d.raw).args[0]) for d in deliveries]


def test_garbage_pushed_into_a_ready_list_comes_out_as_a_delivery_with_those_exact_bytes(
    broker: RedisBroker, client: redis.Redis
) -> None:
    garbage = b"\xff\x00not msgpack\x00\xc1" * 3
    client.rpush(queue_keys("q").ready[0], garbage)
    consumer = broker.consumer(["q"])
    [delivery] = consumer.fetch(10, 1.0)
    assert delivery.raw == garbage
    assert delivery.queue == "q"
    consumer.dead_letter(delivery, "not a hurtle message")
    [dead] = broker.dead_letters("q")
    assert (dead.raw, dead.reason, dead.message()) == (garbage, "not a hurtle message", None)
    assert broker.stats(["q"])["q"].in_flight == 0
    consumer.close()


def test_far_future_delayed_message_is_not_redelivered_by_recovery(redis_url: str) -> None:
    b = make_broker(redis_url, heartbeat_timeout=0.2)
    try:
        b.publish([msg("q", 1, eta=time.time() + 3600)])
        dead_worker = b.consumer(["q"])
        assert dead_worker.fetch(10, 0.05) == []
        time.sleep(0.3)
        assert b.recover() == 0
        survivor = b.consumer(["q"])
        survivor.heartbeat()
        assert survivor.fetch(10, 0.05) == []
        assert b.stats(["q"])["q"] == QueueStats(delayed=1)
        survivor.close()
    finally:
        b.close()


def test_slow_task_on_a_live_worker_is_never_redelivered(redis_url: str) -> None:
    b = make_broker(redis_url, heartbeat_timeout=0.3)
    try:
        b.publish([msg("q", 1)])
        slow = b.consumer(["q"])
        [held] = slow.fetch(1, 1.0)
        other = b.consumer(["q"])
        for _ in range(6):  # 0.6 s: twice the timeout, while the slow worker keeps beating
            slow.heartbeat()
            other.heartbeat()
            assert other.fetch(1, 0.1) == []
        slow.ack([held])
        assert b.stats(["q"])["q"].in_flight == 0
        slow.close()
        other.close()
    finally:
        b.close()


def test_recovered_messages_go_back_to_the_front_in_their_original_order(
    redis_url: str,
) -> None:
    b = make_broker(redis_url, heartbeat_timeout=0.2)
    try:
        b.publish([msg("q", i) for i in range(10)])
        crashed = b.consumer(["q"])
        assert numbers(crashed.fetch(4, 1.0)) == [0, 1, 2, 3]
        time.sleep(0.3)
        survivor = b.consumer(["q"])
        survivor.heartbeat()
        assert numbers(survivor.fetch(100, 1.0)) == list(range(10))
        survivor.close()
    finally:
        b.close()


def test_a_worker_declared_dead_that_acks_late_changes_nothing(redis_url: str) -> None:
    b = make_broker(redis_url, heartbeat_timeout=0.2)
    try:
        b.publish([msg("q", 1)])
        late = b.consumer(["q"])
        held = late.fetch(1, 1.0)
        time.sleep(0.3)
        assert b.recover() == 1
        late.ack(held)
        assert b.stats(["q"])["q"].ready == 1
        late.close()
    finally:
        b.close()


def test_an_idle_consumer_blocks_server_side_and_wakes_on_a_single_publish(
    broker: RedisBroker,
) -> None:
    consumer = broker.consumer(["q"])
    got: list[Delivery] = []
    woke_at: list[float] = []

    def wait() -> None:
        got.extend(consumer.fetch(10, 10.0))
        woke_at.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)  # the consumer is now inside BLPOP
    sent_at = time.monotonic()
    broker.publish([msg("q", 7)])
    thread.join(5)
    assert numbers(got) == [7]
    assert woke_at[0] - sent_at < 0.5  # far below the 5 s BLPOP step: woken, not polled
    consumer.close()


def _blocked(client: redis.Redis) -> None:
    """Return once a client of the server waits in ``BLPOP`` (an idle consumer)."""
    deadline = time.monotonic() + 10
    while not any(c.get("cmd") == "blpop" for c in client.client_list()):
        assert time.monotonic() < deadline, "no consumer came to wait in BLPOP"
        time.sleep(0.01)


def test_a_consumer_woken_to_fewer_than_it_asked_for_prefetches_nothing_until_they_ran(
    broker: RedisBroker, client: redis.Redis
) -> None:
    consumer = broker.consumer(["q"])
    got: list[Delivery] = []
    thread = threading.Thread(target=lambda: got.extend(consumer.fetch(10, 10.0)))
    thread.start()
    _blocked(client)
    broker.publish([msg("q", 1)])
    thread.join(5)
    assert numbers(got) == [1]
    # the queue ran dry with that one: a prefetch now is not sent, so nothing stands between
    # the worker and the task that woke it; the next fetch takes what came meanwhile
    broker.publish([msg("q", 2)])
    consumer.prefetch(10)
    assert consumer.take_prefetched() == []
    assert broker.stats(["q"])["q"] == QueueStats(ready=1, in_flight=1)
    # a batch taken from a backlog is followed by a prefetch, as before
    broker.publish([msg("q", 3), msg("q", 4)])
    assert numbers(consumer.fetch(1, 1.0)) == [2]
    consumer.prefetch(10)
    assert numbers(consumer.take_prefetched()) == [3, 4]
    consumer.close()


def test_several_idle_consumers_all_wake_for_a_large_publish(broker: RedisBroker) -> None:
    consumers = [broker.consumer(["q"]) for _ in range(4)]
    got: list[list[Delivery]] = [[] for _ in consumers]

    def wait(i: int) -> None:
        got[i].extend(consumers[i].fetch(10, 3.0))

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    broker.publish([msg("q", i) for i in range(40)])
    for t in threads:
        t.join(5)
    assert [len(g) for g in got] == [10, 10, 10, 10]
    assert sorted(numbers([d for g in got for d in g])) == list(range(40))
    for c in consumers:
        c.close()


def test_a_consumer_sleeping_on_a_long_timeout_learns_of_a_new_delayed_message(
    broker: RedisBroker,
) -> None:
    consumer = broker.consumer(["q"])
    got: list[Delivery] = []
    thread = threading.Thread(target=lambda: got.extend(consumer.fetch(1, 4.0)))
    thread.start()
    time.sleep(0.2)
    published = time.monotonic()
    broker.publish([msg("q", 5, eta=time.time() + 0.3)])
    thread.join(5)
    waited = time.monotonic() - published
    assert numbers(got) == [5]
    assert 0.25 <= waited < 2.0
    consumer.close()


def test_identical_delayed_payloads_stay_two_messages(broker: RedisBroker) -> None:
    twice = msg("q", 1, eta=time.time() + 0.1)
    broker.publish([twice, twice])
    assert broker.stats(["q"])["q"].delayed == 2
    consumer = broker.consumer(["q"])
    deadline = time.monotonic() + 3
    got: list[Delivery] = []
    while len(got) < 2 and time.monotonic() < deadline:
        got += consumer.fetch(10, 1.0)
    assert [d.raw for d in got] == [twice.encode(), twice.encode()]
    consumer.close()


def test_batches_larger_than_a_lua_chunk_round_trip_intact(broker: RedisBroker) -> None:
    n = 9_000  # above the 4,000-value chunk the scripts use for unpack()
    broker.publish([msg("q", i, priority=i % 2) for i in range(n)])
    consumer = broker.consumer(["q"])
    first = consumer.fetch(n, 1.0)
    assert len(first) == n
    odd, even = numbers(first[: n // 2]), numbers(first[n // 2 :])
    assert odd == list(range(1, n, 2)) and even == list(range(0, n, 2))
    consumer.release(first)
    again = consumer.fetch(n, 1.0)
    assert [d.raw for d in again] == [d.raw for d in first]
    consumer.ack(again)
    assert broker.stats(["q"])["q"] == QueueStats()
    consumer.close()


def test_scripts_forgotten_by_the_server_are_loaded_again(
    broker: RedisBroker, client: redis.Redis
) -> None:
    consumer = broker.consumer(["q"])
    broker.publish([msg("q", 1)])
    client.script_flush()
    broker.publish([msg("q", 2), msg("other", 3)])  # a pipeline of two scripts
    client.script_flush()
    held = consumer.fetch(10, 1.0)
    assert numbers(held) == [1, 2]
    client.script_flush()
    assert broker.stats() == {
        "other": broker.stats(["other"])["other"],
        "q": broker.stats(["q"])["q"],
    }
    assert broker.stats(["q"])["q"].in_flight == 2
    # the acker's pipeline (records and acknowledgements), sent without redis-py's layer
    client.script_flush()
    consumer.ack(held, StoredResults(["r1", "r2"], [b"a", b"b"], 60.0))
    assert broker.stats(["q"])["q"].in_flight == 0
    assert (broker.get_result("r1"), broker.get_result("r2")) == (b"a", b"b")
    hashes = client.keys(RESULT_KEY_PREFIX + "*")
    assert hashes and all(0 < client.pttl(name) <= 60_000 for name in hashes)
    # and a batch of records kept whole, its acknowledgement's script packed by the worker
    messages = [Message(id=new_id(), task="tests.add", queue="q", args=(i, 6)) for i in range(40)]
    broker.publish(messages)
    got = consumer.fetch(40, 1.0)
    stored = stored_batch(got, list(range(40)))
    assert stored.batches is not None
    client.script_flush()
    consumer.ack(got, stored)
    assert broker.stats(["q"])["q"].in_flight == 0
    assert [broker.get_result(m.id) for m in messages] == stored.batches[0].payloads()
    consumer.close()


def test_every_key_of_a_queue_shares_its_hash_tag(broker: RedisBroker, client: redis.Redis) -> None:
    broker.publish([msg("jobs", i, priority=i) for i in range(10)])
    broker.publish([msg("jobs", 99, eta=time.time() + 60)])
    consumer = broker.consumer(["jobs"])
    held = consumer.fetch(3, 1.0)
    consumer.dead_letter(held[0], "test")
    consumer.heartbeat()
    keys = {k.decode() for k in cast(list[bytes], client.keys("*"))}
    assert QUEUES in keys and DEAD_INDEX in keys  # outside any queue: read by name or id
    assert all(k.startswith("hurtle:{jobs}:") for k in keys - {QUEUES, DEAD_INDEX})
    assert queue_keys("jobs").inflight(consumer.worker_id) in keys
    consumer.close()


def test_cross_queue_retry_moves_the_message_to_the_other_queue(broker: RedisBroker) -> None:
    broker.publish([msg("a", 1)])
    consumer = broker.consumer(["a"])
    [held] = consumer.fetch(1, 1.0)
    moved = msg("b", 2, priority=3)
    consumer.retry(held, moved)
    stats = broker.stats(["a", "b"])
    assert (stats["a"].in_flight, stats["b"].ready) == (0, 1)
    assert broker.queues() == ["a", "b"]
    consumer.close()


def test_password_is_left_out_of_the_broker_url(redis_url: str) -> None:
    secret = redis_url.replace("redis://", "redis://:s3cret@")
    b = make_broker(secret)
    assert "s3cret" not in b.url
    assert b.url == redis_url
    b.close()


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:notaport/0", "redis://localhost/notadb", "redis://h/0?db=x"]
)
def test_bad_url_raises_configuration_error_naming_it(url: str) -> None:
    with pytest.raises(ConfigurationError, match="bad Redis URL"):
        make_broker(url)


def test_a_crash_after_partial_acks_recovers_exactly_the_unsettled_messages(
    redis_url: str,
) -> None:
    b = make_broker(redis_url, heartbeat_timeout=0.2)
    try:
        b.publish([msg("q", i) for i in range(10)])
        crashed = b.consumer(["q"])
        held = crashed.fetch(10, 1.0)
        crashed.ack([held[1], held[3]])
        crashed.ack([held[3], held[1], held[5]])  # acked twice: still settled once
        crashed.dead_letter(held[7], "bad")
        crashed.release([held[9]])
        assert b.stats(["q"])["q"] == QueueStats(ready=1, in_flight=5, dead=1)
        time.sleep(0.3)
        survivor = b.consumer(["q"])
        survivor.heartbeat()
        assert numbers(survivor.fetch(100, 1.0)) == [0, 2, 4, 6, 8, 9]
        survivor.close()
    finally:
        b.close()


def test_acking_every_message_of_a_batch_in_pieces_leaves_no_keys_behind(
    broker: RedisBroker, client: redis.Redis
) -> None:
    broker.publish([msg("q", i) for i in range(100)])
    consumer = broker.consumer(["q"])
    held = consumer.fetch(100, 1.0)
    consumer.ack(held[50:])
    consumer.ack(held[:50][::-1])
    consumer.ack(held[:10])
    assert broker.stats(["q"])["q"] == QueueStats()
    consumer.close()
    keys = {k.decode() for k in cast(list[bytes], client.keys("*"))}
    assert not [k for k in keys if ":inflight:" in k]


def test_malformed_members_of_the_delayed_set_become_dead_letters_and_the_queue_runs_on(
    broker: RedisBroker, client: redis.Redis
) -> None:
    broker.publish([msg("q", 1, eta=time.time() + 0.05)])  # a real delayed message
    garbage = [b"garbage", b"x:1:payload", b"12:00ab:payload", b"3:zz:payload", b"", b"4::\xff"]
    client.zadd(queue_keys("q").delayed, {g: time.time() - 10 for g in garbage})
    consumer = broker.consumer(["q"])
    got: list[Delivery] = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        got = consumer.fetch(10, 1.0)
    assert numbers(got) == [1]
    dead = broker.dead_letters("q")
    assert sorted(d.raw for d in dead) == sorted(garbage)
    assert all("malformed member of the delayed set" in d.reason for d in dead)
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=1, dead=len(garbage))
    consumer.close()


def test_retry_of_a_stored_message_with_an_out_of_range_priority_dead_letters_it(
    broker: RedisBroker,
) -> None:
    bad = Message(id=new_id(), task="t", queue="q", priority=12)
    broker.publish_raw("q", [bad.encode()])  # written by something else than hurtle's publish
    consumer = broker.consumer(["q"])
    [held] = consumer.fetch(1, 1.0)
    consumer.retry(held, msgspec.structs.replace(bad, attempt=1))
    [dead] = broker.dead_letters("q")
    assert dead.raw == held.raw
    assert "priority 12" in dead.reason and "out of range" in dead.reason
    assert broker.stats(["q"])["q"] == QueueStats(dead=1)
    consumer.close()


def test_a_batch_of_results_packed_by_hand_is_the_command_hiredis_would_send() -> None:
    # the worker packs a batch's HSET itself (redis/results.py): byte for byte what hiredis makes
    hiredis = pytest.importorskip("hiredis")
    from hurtle.brokers.redis.results import _hset

    stamp = b"1795685116430"
    for n, size in ((1, 0), (3, 1), (1000, 150)):
        ids = [new_id() for _ in range(n)]
        payloads = [bytes([i % 256]) * ((size + i) % 700) for i in range(n)]
        fields: list[object] = [None] * (2 * n)
        fields[0::2] = ids
        fields[1::2] = [stamp + p for p in payloads]
        expected = hiredis.pack_command(("HSET", "hurtle:results:{k}", *fields))
        assert _hset("hurtle:results:{k}", ids, payloads, stamp) == expected


def test_a_result_hash_has_its_expiry_whatever_part_of_its_batch_reached_the_server(
    broker: RedisBroker, client: redis.Redis
) -> None:
    # a worker killed mid-send, or a connection cut, runs only the first commands of a flush:
    # whichever prefix ran, every hash of results it made goes away by itself
    from hurtle.brokers.redis.results import _results_commands

    ids = [new_id() for _ in range(50)]
    one_by_one = StoredResults(ids, [msgspec.msgpack.encode(i) for i in range(50)], 60.0)
    deliveries = [
        Delivery("q", Message(id=i, task="tests.add", queue="q").encode(), 0) for i in ids
    ]
    whole = stored_batch(deliveries, list(range(50)))
    assert whole.batches is not None
    for results, expected in (
        (one_by_one, one_by_one.payloads),
        (whole, whole.batches[0].payloads()),
    ):
        _check_every_prefix(broker, client, _results_commands(broker, results), ids, expected)
    client.flushdb()
    # the placeholder that holds a new hash's expiry reads as no result
    commands = _results_commands(broker, StoredResults([ids[0]], [b"\x01"], 60.0))
    broker._pipeline_raw(commands[:1], "giving a hash its expiry")
    [name] = client.keys(RESULT_KEY_PREFIX + "*")
    assert client.hgetall(name) == {b"": b""}
    assert broker.get_result(ids[0]) is None
    assert broker.get_result("") is None


def _check_every_prefix(
    broker: RedisBroker,
    client: redis.Redis,
    commands: list[Any],
    ids: list[str],
    expected: list[bytes],
) -> None:
    assert len(commands) >= 3  # the expiry, the records, the announcement
    for ran in range(len(commands) + 1):
        client.flushdb()
        if ran:
            broker._pipeline_raw(commands[:ran], "storing part of a batch of results")
        hashes = client.keys(RESULT_KEY_PREFIX + "*")
        for name in hashes:
            assert 0 < client.pttl(name) <= 60_000, (ran, name)
        if ran >= 2:
            assert hashes
            assert [broker.get_result(i) for i in ids] == expected
    # the same after the server forgot its scripts (a restart, SCRIPT FLUSH), sent one by
    # one and each reply read, with no reload and no retry: a worker killed before it could
    # run again what failed
    for ran in range(1, len(commands) + 1):
        client.flushdb()
        client.script_flush()
        conn = client.connection_pool.get_connection()
        try:
            for args, _ in commands[:ran]:
                if args[0] is RAW:
                    conn.send_packed_command([args[1]])
                else:
                    conn.send_command(*args)
                with contextlib.suppress(redis.ResponseError):  # NOSCRIPT: it did not run
                    conn.read_response()
        finally:
            client.connection_pool.release(conn)
        hashes = client.keys(RESULT_KEY_PREFIX + "*")
        assert hashes or ran < 2, ran  # the records were written by then
        for name in hashes:
            assert 0 < client.pttl(name) <= 60_000, ("after SCRIPT FLUSH", ran, name)


def test_a_batch_of_records_is_one_field_of_the_hash_of_batches_of_each_bucket_it_spans(
    broker: RedisBroker, client: redis.Redis
) -> None:
    # 48 ids across a bucket (all but the last three hex digits shared): no field per record,
    # one field per bucket holding the whole batch, named by its first and last id there
    ids = [f"0123456789abcdef0001{n:04x}" for n in range(0xFE0, 0x1010)]
    broker.publish(
        [Message(id=i, task="tests.add", queue="q", args=(n, 6)) for n, i in enumerate(ids)]
    )
    c = broker.consumer(["q"])
    got = c.fetch(100, 1)
    assert [Message.decode(d.raw).id for d in got] == ids
    stored = stored_batch(got, [n + 6 for n in range(48)], ttl=600.0)
    assert stored.batches is not None
    expected = stored.batches[0].payloads()
    c.ack(got, stored)
    low, high = (
        f"{RESULT_KEY_PREFIX}0123456789abcdef00010}}",
        f"{RESULT_KEY_PREFIX}0123456789abcdef00011}}",
    )
    assert sorted(client.keys(RESULT_KEY_PREFIX + "*")) == [
        f"{low}:batches".encode(),
        f"{high}:batches".encode(),
    ]
    for name, first, last in ((low, ids[0], ids[31]), (high, ids[32], ids[47])):
        # written in the acknowledgement's script: no placeholder holds the expiry first
        assert client.hkeys(f"{name}:batches") == [f"{first} {last}".encode()]
        assert 590_000 < client.pttl(f"{name}:batches") <= 600_000
    assert [broker.get_result(i) for i in ids] == expected
    assert broker.get_result(ids[0][:-4] + "0fdf") is None  # just before the batch
    assert broker.get_result(ids[0][:-4] + "1010") is None  # just after it
    c.close()


def test_unique_locks_packed_by_hand_are_the_command_hiredis_would_send() -> None:
    hiredis = pytest.importorskip("hiredis")
    from hurtle.brokers.redis.limits import _hdel

    cases = (
        ["a"],
        ["bench.add:929", "with space", "é"],
        [f"k{i}" for i in range(999)],
        [f"bench.add:{i:08x}" for i in range(1000)],  # one length, ASCII: one join
        ["ab", "a", "abc"],  # lengths that add up as if they were one
        ["é", "a"],  # one length in characters, not in bytes
        ["a\r\n$2\r\nb", "a\r\n$2\r\nc"],  # fields holding what a header looks like
    )
    for fields in cases:
        assert _hdel("hurtle:{q}:unique", fields) == hiredis.pack_command(
            ("HDEL", "hurtle:{q}:unique", *fields)
        )


@pytest.mark.parametrize(
    "receipts",
    [
        [(7 << 20) + i for i in range(1000)],  # one batch, whole
        [(7 << 20) + i for i in range(300, 1000)] + [(8 << 20) + i for i in range(476)],
        [(7 << 20) + i for i in range(5)] + [(9 << 20) + 3, (9 << 20) + 4, (12 << 20)],
        [(7 << 20) + i for i in (0, 1, 3, 4)] + [(8 << 20) + 1],  # a gap
        [(7 << 20) + 1, (7 << 20) + 1, (7 << 20) + 2, (8 << 20)],  # a receipt twice
        [(8 << 20) + 2, (7 << 20) + 5, (8 << 20) + 1],  # out of order
    ],
)
def test_ack_arguments_name_each_receipt_once_per_batch(receipts: list[int]) -> None:
    from hurtle.brokers.keys import BATCH_BITS
    from hurtle.brokers.redis.settling import _ack_args

    args = _ack_args(receipts)
    named: list[int] = []
    batches = []
    for at in range(0, len(args), 3):
        batch, count, packed = args[at : at + 3]
        indexes = list(struct.unpack(f"<{count}I", packed))
        assert indexes == sorted(set(indexes))  # distinct, ascending, as ack.lua expects
        named += [(batch << BATCH_BITS) | i for i in indexes]
        batches.append(batch)
    assert batches == sorted(set(batches))
    assert sorted(named) == sorted(set(receipts))
