"""Conformance of limits and unique locks: deferral, rate tokens, concurrency slots, unique
locks (``brokers/base.py``), on every broker."""

from __future__ import annotations

import time
from collections.abc import Callable

import dead_roads
import msgspec
import pytest
from dead_roads import QUEUE, ROADS, dead_app, message, on_road, send

from hurtle.brokers import Broker, Consumer, Delivery, QueueStats, StoredResults
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q", *args: object, **fields: object) -> Message:
    return Message(id=new_id(), task="tests.add", queue=queue, args=args, **fields)  # type: ignore[arg-type]


def unique(key: str, queue: str = "q", *args: object) -> Message:
    return msg(queue, *args, headers={"unique": key})


def drain(consumer: Consumer) -> list[Delivery]:
    out: list[Delivery] = []
    while batch := consumer.fetch(100, 0):
        out += batch
    return out


def wait_for(fetch: Callable[[], list[Delivery]], seconds: float = 10.0) -> list[Delivery]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if got := fetch():
            return got
    return []


# -- deferral --------------------------------------------------------------------------------


def test_defer_puts_the_delivery_back_unchanged_at_its_eta(broker: Broker) -> None:
    m = msg("q", 1, attempt=2)
    broker.publish([m])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.defer(d, time.time() + 0.3)
    assert broker.stats(["q"])["q"].delayed == 1
    assert c.fetch(1, 0) == []
    [again] = wait_for(lambda: c.fetch(1, 1))
    assert again.raw == m.encode()  # same bytes: same attempt, same headers


def test_defer_many_in_the_past_makes_them_ready_at_once(broker: Broker) -> None:
    broker.publish([msg("q", i) for i in range(3)])
    c = broker.consumer(["q"])
    got = c.fetch(3, 1)
    c.defer_many([(d, 0.0) for d in got])
    assert broker.stats(["q"])["q"] == QueueStats(ready=3)
    assert sorted(Message.decode(d.raw).args[0] for d in drain(c)) == [0, 1, 2]


def test_defer_of_a_settled_delivery_does_nothing(broker: Broker) -> None:
    broker.publish([msg("q")])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.ack([d])
    c.defer(d, 0.0)
    assert drain(c) == []


# -- rate tokens -----------------------------------------------------------------------------


def test_take_tokens_grants_a_burst_then_says_when_the_next_is_due(make: MakeBroker) -> None:
    a, b = make(), make()
    # 100 per 10 s: one every 0.1 s, at most 10 (a tenth) at once
    started = time.monotonic()
    [(got, wait)] = a.take_tokens([("k", 100, 10.0, 15)])
    assert got == 10
    assert 0 < wait <= 0.1 + 1e-6
    [(more, wait)] = b.take_tokens([("k", 100, 10.0, 10)])  # another client shares the limit
    # one more per 0.1 s between the two calls (on a loaded machine that may be a few), never
    # the fresh burst of 10 a limit of its own would grant
    assert more <= 1 + int((time.monotonic() - started) / 0.1)
    assert more < 10
    assert 0 < wait <= 0.1 + 1e-6


def test_take_tokens_keys_are_independent_and_taken_in_one_call(broker: Broker) -> None:
    got = broker.take_tokens([("a", 2, 60.0, 5), ("b", 3, 60.0, 1), ("c", 1, 60.0, 0)])
    assert [g for g, _ in got] == [2, 1, 0]  # a burst is 2 at least
    assert 29.0 < got[0][1] <= 30.0 + 1e-6  # 60 s / 2: the next token in 30 s
    assert got[1][1] == 0.0 and got[2][1] == 0.0


def test_tokens_come_back_with_time(broker: Broker) -> None:
    [(got, wait)] = broker.take_tokens([("k", 5, 0.5, 10)])
    assert got == 2
    time.sleep(wait + 0.05)
    [(again, _)] = broker.take_tokens([("k", 5, 0.5, 1)])
    assert again == 1


def test_a_rate_limit_never_grants_more_than_its_tokens_over_time(broker: Broker) -> None:
    granted = 0
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        granted += broker.take_tokens([("k", 200, 1.0, 50)])[0][0]
    elapsed = time.monotonic() - started
    assert granted <= 200 * elapsed + 20 + 1  # the rate, plus one burst (a tenth)


# -- concurrency slots -----------------------------------------------------------------------


def test_slots_are_shared_across_consumers_and_come_back_when_released(
    make: MakeBroker,
) -> None:
    one, two = make().consumer(["q"]), make().consumer(["q"])
    assert one.acquire_slots([("k", 3, 2)]) == [2]
    assert two.acquire_slots([("k", 3, 2), ("other", 3, 2)]) == [1, 2]
    assert two.acquire_slots([("k", 3, 1)]) == [0]
    one.release_slots([("k", 2)])
    assert two.acquire_slots([("k", 3, 5)]) == [2]


def test_slots_of_a_closed_consumer_are_free(make: MakeBroker) -> None:
    one, two = make().consumer(["q"]), make().consumer(["q"])
    assert one.acquire_slots([("k", 2, 2)]) == [2]
    one.close()
    assert two.acquire_slots([("k", 2, 2)]) == [2]


def test_slots_of_a_silent_consumer_are_free_after_its_deadline(make: MakeBroker) -> None:
    crashed = make(heartbeat_timeout=0.3).consumer(["q"])
    alive = make(heartbeat_timeout=30.0).consumer(["q"])
    assert crashed.acquire_slots([("k", 2, 2)]) == [2]
    assert alive.acquire_slots([("k", 2, 1)]) == [0]
    deadline = time.monotonic() + 10
    got = [0]
    while time.monotonic() < deadline and got == [0]:
        time.sleep(0.1)
        alive.heartbeat()
        got = alive.acquire_slots([("k", 2, 1)])
    assert got == [1]


def test_a_beating_consumer_keeps_its_slots_past_its_timeout(make: MakeBroker) -> None:
    holder = make(heartbeat_timeout=0.5).consumer(["q"])
    other = make(heartbeat_timeout=30.0).consumer(["q"])
    assert holder.acquire_slots([("k", 1, 1)]) == [1]
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        holder.heartbeat()
        assert other.acquire_slots([("k", 1, 1)]) == [0]
        time.sleep(0.1)


# -- unique locks ----------------------------------------------------------------------------


def test_publish_unique_enqueues_one_and_returns_the_holder_id(make: MakeBroker) -> None:
    a, b = make(), make()
    first, dup_in_batch, other = unique("x"), unique("x"), unique("y")
    assert a.publish_unique([first, dup_in_batch, other], 60) == [first.id, first.id, other.id]
    later = unique("x")
    assert b.publish_unique([later], 60) == [first.id]
    c = a.consumer(["q"])
    got = drain(c)
    assert sorted(Message.decode(d.raw).id for d in got) == sorted([first.id, other.id])


@pytest.mark.parametrize("until", [0.0, 3600.0], ids=["end-unknown", "end-far-off"])
def test_released_lock_lets_a_new_message_in(broker: Broker, until: float) -> None:
    # an end far off lets a broker end the lock without reading it (Redis: a plain HDEL)
    first = msg("q", headers={"unique": "x", "unique_until": time.time() + until})
    broker.publish_unique([first], 60)
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.ack([d])
    c.release_unique([("q", "x", first.id, time.time() + until if until else 0.0)])
    second = unique("x")
    assert broker.publish_unique([second], 60) == [second.id]


@pytest.mark.parametrize("until", [0.0, 3600.0], ids=["end-unknown", "end-far-off"])
def test_ack_and_release_settles_stores_and_lets_new_messages_in(
    broker: Broker, until: float
) -> None:
    # the acker's flush when settled messages hold locks (Redis: one round trip for all)
    end = time.time() + until if until else 0.0
    held = [msg("q", headers={"unique": k, "unique_until": end}) for k in ("x", "y")]
    assert broker.publish_unique(held, 60) == [m.id for m in held]
    c = broker.consumer(["q"])
    got = drain(c)
    records = StoredResults([m.id for m in held], [b"1", b"2"], 60.0)
    c.ack_and_release(got, records, [("q", k, m.id, end) for k, m in zip("xy", held, strict=True)])
    assert broker.stats(["q"])["q"].in_flight == 0
    assert [broker.get_result(m.id) for m in held] == [b"1", b"2"]
    again = [unique("x"), unique("y")]
    assert broker.publish_unique(again, 60) == [m.id for m in again]


def test_release_leaves_a_lock_taken_by_another_message(broker: Broker) -> None:
    first = unique("x")
    broker.publish_unique([first], 0.2)
    time.sleep(0.3)  # the lock expired: a new message takes it
    second = unique("x")
    assert broker.publish_unique([second], 60) == [second.id]
    # the first message's lock ended (its until passed): the release must read the lock
    broker.consumer(["q"]).release_unique([("q", "x", first.id, time.time() - 0.1)])
    assert broker.publish_unique([unique("x")], 60) == [second.id]


def test_lock_ends_at_the_until_its_message_names(broker: Broker) -> None:
    # a lock lasts until headers["unique_until"] (the sender's created + unique_for) when the
    # message names it, on a broker that keeps it (others end it unique_for after publishing)
    first = msg("q", headers={"unique": "x", "unique_until": time.time() + 0.3})
    assert broker.publish_unique([first], 60) == [first.id]
    assert broker.publish_unique([unique("x")], 60) == [first.id]
    deadline = time.monotonic() + 120
    again = unique("x")
    while broker.publish_unique([again], 60) != [again.id]:
        assert time.monotonic() < deadline, "the lock outlived its message's unique_until"
        time.sleep(0.05)


def test_lock_expires_after_unique_for(broker: Broker) -> None:
    first = unique("x")
    broker.publish_unique([first], 0.2)
    deadline = time.monotonic() + 10
    again = unique("x")
    while broker.publish_unique([again], 60) != [again.id]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert len(drain(broker.consumer(["q"]))) == 2


def test_unique_locks_are_per_queue_and_keep_delays(broker: Broker) -> None:
    a = unique("x", "q1")
    b = msgspec.structs.replace(unique("x", "q2"), eta=time.time() + 60)
    assert broker.publish_unique([a, b], 60) == [a.id, b.id]
    stats = broker.stats(["q1", "q2"])
    assert stats["q1"].ready == 1 and stats["q2"].delayed == 1


def test_publish_unique_needs_a_key(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match="unique"):
        broker.publish_unique([msg("q")], 60)
    assert broker.stats(["q"])["q"].ready == 0


def test_every_road_to_a_dead_letter_ends_the_unique_lock_of_its_message(broker_url: str) -> None:
    """Failed for good, rejected, unfit, expired, cancelled, of an unknown task, undecodable:
    the lock ends with the dead letter, and the same call sent again is enqueued and runs."""
    app = dead_app(broker_url, unique_for=600)
    try:
        until = time.time() + 600
        roads = {
            road: on_road(road, message(unique=f"k-{road}", unique_until=until)) for road in ROADS
        }
        send(app, roads, unique_for=600)
        for road in roads:  # held, until the dead letter
            assert app.broker.publish_unique([message(unique=f"k-{road}")], 600) == [roads[road].id]
        dead_roads.drain(app)
        assert app.broker.stats([QUEUE])[QUEUE].dead == len(ROADS)
        again = {road: message(unique=f"k-{road}", args=(2,)) for road in ROADS}
        holders = app.broker.publish_unique(list(again.values()), 600)
        still = [
            road for road, holder in zip(again, holders, strict=True) if holder != again[road].id
        ]
        assert not still, f"the lock outlived the dead letter of: {still}"
        dead_roads.drain(app)  # the calls sent again run
        stats = app.broker.stats([QUEUE])[QUEUE]
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, len(ROADS))
    finally:
        app.close()
