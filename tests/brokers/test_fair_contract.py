"""Conformance of fair queues (``hurtle.fair``) on every broker: each key's sub-queue
(``names.fair_queue``) is a queue the broker stores, lists and counts, and a ``FairConsumer``
reads a queue's keys by turns, each delivery settled per message by the session that fetched it
(acknowledged, retried or dead-lettered in its sub-queue, kept alive by the heartbeat, handed
back on close), and forgets the sub-queues that stay empty."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest

from hurtle.brokers import Broker, Delivery, QueueStats
from hurtle.brokers import fair_consumer as fair_module
from hurtle.brokers.fair_consumer import FairConsumer
from hurtle.brokers.sharded import ShardedBroker
from hurtle.ids import new_id
from hurtle.message import Message
from hurtle.names import fair_queue

MakeBroker = Callable[..., Broker]
A, B = fair_queue("q", "tenant-a"), fair_queue("q", "tenant-b")


def msg(queue: str, n: int = 0) -> Message:
    """A message of ``queue`` whose first argument names it (a sharded broker hands out a
    key's messages naming its queue: the argument tells the keys apart)."""
    return Message(id=new_id(), task="tests.noop", queue=queue, args=(queue, n))


def stored(broker: Broker) -> list[str]:
    """The queues the store holds (a sharded broker lists its queues' sub-queues as theirs)."""
    return broker.inner.queues() if isinstance(broker, ShardedBroker) else broker.queues()


def fair(broker: Broker, weights: dict[str, int] | None = None) -> FairConsumer:
    return FairConsumer(broker, broker.consumer(["q"]), weights or {})


def keys_of(got: list[Delivery]) -> list[str]:
    return [Message.decode(d.raw).args[0] for d in got]


def test_a_keys_sub_queue_is_stored_listed_and_counted(make: MakeBroker) -> None:
    a, b = make(), make()
    a.publish([msg(A), msg(A), msg(B)])
    until = time.time() + 60
    first, second = (msgspec.structs.replace(msg(B), unique="k", unique_until=until) for _ in "12")
    assert a.publish_unique([first, second], 60) == [first.id, first.id]  # one lock per key
    assert {A, B} <= set(stored(b))
    counts = b.stats() if not isinstance(b, ShardedBroker) else b.inner.stats([A, B])
    assert counts[A].ready == 2 and counts[B].ready == 2


def test_a_fair_consumer_serves_a_small_key_in_the_first_batch_behind_a_large_one(
    make: MakeBroker,
) -> None:
    broker = make()
    broker.publish([msg(A, i) for i in range(60)])
    broker.publish([msg(B, i) for i in range(5)])
    broker.publish([msg("q", 99)])  # sent to the queue itself: its own turn
    consumer = fair(broker)
    try:
        first = consumer.fetch(12, 2.0)
        assert len(first) == 12
        assert {d.queue for d in first} == {A, B, "q"}  # each where it is settled
        keys = keys_of(first)
        assert keys.count(B) == 5 and "q" in keys, keys
        consumer.ack(first)
        rest: list[Delivery] = []
        while len(rest) < 54:
            got = consumer.fetch(100, 2.0)
            assert got, "the large key's messages were not all fetched"
            rest += got
            consumer.ack(got)
        assert keys_of(rest) == [A] * 54
        assert consumer.fetch(10, 0.3) == []
    finally:
        consumer.close()
    counts = broker.stats(["q"]) if isinstance(broker, ShardedBroker) else broker.stats([A, B])
    assert all(s.ready == 0 and s.in_flight == 0 for s in counts.values())


def test_a_heavier_key_gets_more_of_each_batch(make: MakeBroker) -> None:
    broker = make()
    broker.publish([msg(A, i) for i in range(40)])
    broker.publish([msg(B, i) for i in range(40)])
    consumer = fair(broker, {A: 3})
    try:
        one = consumer.fetch(1, 2.0)  # lists the keys; the queue itself is found empty
        got = consumer.fetch(16, 2.0)
        keys = keys_of(got)
        assert len(got) == 16 and keys.count(A) == 3 * keys.count(B), keys
        consumer.release(one + got)
    finally:
        consumer.close()


def test_retries_and_dead_letters_stay_in_their_keys_sub_queue(make: MakeBroker) -> None:
    broker = make()
    broker.publish([msg(A, 1), msg(A, 2)])
    consumer = fair(broker)
    try:
        first, second = consumer.fetch(2, 2.0)
        retried = Message.decode(first.raw)
        consumer.retry(first, msgspec.structs.replace(retried, attempt=1))
        consumer.dead_letter(second, "failed")
        again = consumer.fetch(10, 2.0)
        assert [Message.decode(d.raw).attempt for d in again] == [1]
        assert keys_of(again) == [A]
        consumer.ack(again)
    finally:
        consumer.close()
    dead = broker.find_dead(Message.decode(second.raw).id)
    assert dead is not None and dead.reason == "failed"


def test_the_heartbeat_keeps_what_a_keys_session_holds(make: MakeBroker) -> None:
    broker = make(heartbeat_timeout=1.0)
    broker.publish([msg(A)])
    consumer = fair(broker)
    other = make(heartbeat_timeout=1.0)
    try:
        got = consumer.fetch(10, 2.0)
        assert len(got) == 1
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            consumer.heartbeat()
            assert other.recover() == 0
            time.sleep(0.2)
        consumer.ack(got)
    finally:
        consumer.close()


def test_closing_hands_back_what_the_keys_sessions_hold(make: MakeBroker) -> None:
    broker = make()
    broker.publish([msg(A), msg(B)])
    consumer = fair(broker)
    assert len(consumer.fetch(10, 2.0)) == 2
    consumer.close()
    again = fair(make())
    try:
        got = again.fetch(10, 2.0)
        assert sorted(keys_of(got)) == sorted([A, B])
        again.ack(got)
    finally:
        again.close()


def test_a_sub_queue_empty_long_enough_is_forgotten(
    make: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(On SQLite, a broker object writes a queue's name again ``KNOWN_REFRESH`` seconds after it
    last did, 0 here: see ``Broker.forget``.)"""
    from hurtle.brokers.sqlite import broker as sqlite_broker

    monkeypatch.setattr(sqlite_broker, "KNOWN_REFRESH", 0.0)
    monkeypatch.setattr(fair_module, "FORGET_AFTER", 0.0)
    monkeypatch.setattr(fair_module, "REFRESH", 0.0)
    broker = make()
    broker.publish([msg(A), msg(B)])
    consumer = fair(broker)
    try:
        consumer.ack(consumer.fetch(10, 2.0))
        assert consumer.fetch(10, 0.2) == []  # found empty: forgotten at the next listing
        consumer.fetch(10, 0.2)
        assert A not in stored(broker) and B not in stored(broker)
        broker.publish([msg(B)])  # known again with its next message
        got = consumer.fetch(10, 2.0)
        assert keys_of(got) == [B]
        consumer.ack(got)
    finally:
        consumer.close()


def test_a_paused_queues_keys_wait_with_it(
    make: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fair_module, "REFRESH", 0.0)
    broker = make()
    broker.publish([msg(A)])
    broker.pause("q")
    consumer = fair(broker)
    try:
        assert consumer.fetch(10, 0.3) == []
        broker.resume("q")
        got = consumer.fetch(10, 2.0)
        assert keys_of(got) == [A]
        consumer.ack(got)
    finally:
        consumer.close()


def test_a_key_that_comes_while_one_key_is_prefetched_gets_its_turn(
    make: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key alone is prefetched as a queue is; a listing falls due all the same."""
    monkeypatch.setattr(fair_module, "REFRESH", 0.05)
    broker = make()
    broker.publish([msg(A, i) for i in range(200)])
    consumer = fair(broker)
    try:
        taken = consumer.fetch(10, 2.0)
        consumer.prefetch(10)
        broker.publish([msg(B)])
        time.sleep(0.1)
        for _ in range(3):
            got = consumer.fetch(10, 2.0)
            taken += got
            if B in keys_of(got):
                break
            consumer.prefetch(10)
        assert B in keys_of(taken), "the new key was not served within three batches"
        consumer.release(taken)
    finally:
        consumer.close()


def test_what_a_dead_workers_key_sessions_held_is_recovered(make: MakeBroker) -> None:
    broker = make(heartbeat_timeout=0.3)
    broker.publish([msg(A, 1), msg(A, 2), msg(B, 3)])
    dead = fair(broker)
    assert len(dead.fetch(10, 2.0)) == 3  # then it dies: no beat, no close
    time.sleep(0.6)
    assert make(heartbeat_timeout=0.3).recover() == 3
    again = fair(make())
    try:
        got = again.fetch(10, 2.0)
        assert sorted(keys_of(got)) == sorted([A, A, B])
        again.ack(got)
    finally:
        again.close()


def counts_of(broker: Broker, queues: list[str]) -> dict[str, QueueStats]:
    """``stats`` of stored queues (a sharded broker counts its queues' sub-queues as theirs)."""
    return (broker.inner if isinstance(broker, ShardedBroker) else broker).stats(queues)


def test_purge_drops_the_calls_waiting_in_a_queues_keys_and_counts_them(
    make: MakeBroker,
) -> None:
    a, b = make(), make()
    later = time.time() + 3600
    a.publish([msg(A, 1), msg(A, 2), msg(B, 3), msg("q", 4), msg("other", 5)])
    a.publish([msgspec.structs.replace(msg(B, 6), eta=later)])
    consumer = fair(a)
    try:
        held = consumer.fetch(1, 2.0)  # one call a worker holds: purge leaves it
        assert len(held) == 1
        assert b.purge("q") == 4
        waiting = counts_of(b, [A, B])
        assert sum(s.ready + s.delayed for s in waiting.values()) == 0, waiting
        assert sum(s.in_flight for s in waiting.values()) + b.stats(["q"])["q"].in_flight == 1
        assert b.stats(["other"])["other"].ready == 1
        assert consumer.fetch(10, 0.3) == []
        consumer.ack(held)
    finally:
        consumer.close()


def test_a_keys_dead_letter_is_filed_under_its_queue_and_retried_into_its_key(
    make: MakeBroker,
) -> None:
    broker = make()
    broker.publish([msg(A, 1), msg(B, 2), msg("q", 3), msg(B, 4)])
    consumer = fair(broker)
    try:
        got = consumer.fetch(10, 2.0)
        assert len(got) == 4
        consumer.dead_letter_many([(d, "failed") for d in got])
        ids = {Message.decode(d.raw).id: d for d in got}
        other = make()
        dead = other.dead_letters("q")
        assert sorted(d.queue for d in dead) == ["q"] * 4  # where its user looks
        assert {d.message().id for d in dead if d.message()} == set(ids)  # type: ignore[union-attr]
        assert other.dead_letters("q", limit=2, offset=1) == dead[1:3]
        found = other.find_dead(Message.decode(got[0].raw).id)
        assert found is not None and found.queue == "q"
        last = next(d for d in dead if keys_of([ids[d.message().id]]) == [B])  # type: ignore[union-attr]
        assert other.delete_dead("q", [last.id]) == 1
        assert other.retry_dead("q") == 3
        assert other.dead_letters("q") == []
        again = consumer.fetch(10, 2.0)
        # each back in its key's sub-queue (the queue itself for what was sent there)
        assert sorted((d.queue, keys_of([d])[0]) for d in again) == sorted(
            [(A, A), ("q", "q"), (B, B)]
        ), [(d.queue, keys_of([d])) for d in again]
        consumer.dead_letter_many([(d, "failed again") for d in again])
        assert other.purge_dead("q") == 3
        assert other.dead_letters("q") == []
    finally:
        consumer.close()
