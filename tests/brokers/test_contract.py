"""The broker conformance suite: every broker passes every test here (see ``brokers/base.py``).

Tests use ``make()`` for separate clients on one store (for the memory broker it returns the same
object) and ``broker`` for the first one. Nothing here asserts how long something took, only what
came back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from helpers import StallProof
from hurtle.brokers import Broker, Consumer, Delivery, QueueStats, make_broker
from hurtle.brokers.base import MAX_SIZE
from hurtle.errors import ConfigurationError, EncodeError
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q", *args: object, **fields: object) -> Message:
    return Message(id=new_id(), task="tests.add", queue=queue, args=args, **fields)  # type: ignore[arg-type]


def ids_of(deliveries: list[Delivery]) -> list[str]:
    return [Message.decode(d.raw).id for d in deliveries]


def drain(consumer: Consumer, max_count: int = 100) -> list[Delivery]:
    """Everything ready now, without waiting."""
    out: list[Delivery] = []
    while batch := consumer.fetch(max_count, 0):
        out += batch
    return out


# -- publish and fetch -----------------------------------------------------------------------


def test_publish_then_fetch_returns_the_same_bytes(broker: Broker) -> None:
    m = msg("q", 5, 6, kwargs={"x": [1, 2]}, headers={"h": "v"})
    broker.publish([m])
    got = broker.consumer(["q"]).fetch(10, 1)
    assert len(got) == 1
    assert got[0].queue == "q"
    assert got[0].raw == m.encode()
    assert Message.decode(got[0].raw) == m


def test_fetch_returns_at_most_max_count(broker: Broker) -> None:
    broker.publish([msg("q", i) for i in range(10)])
    c = broker.consumer(["q"])
    assert len(c.fetch(3, 1)) == 3
    assert len(c.fetch(100, 1)) == 7
    assert c.fetch(100, 0) == []


def test_fetch_on_an_empty_queue_waits_and_returns_nothing(broker: Broker) -> None:
    c = broker.consumer(["empty"])
    assert c.fetch(10, 0.2) == []
    assert c.fetch(10, 0) == []


def test_fetch_on_a_drained_queue_waits_and_returns_nothing(broker: Broker) -> None:
    broker.publish([msg("q")])
    c = broker.consumer(["q"])
    c.ack(c.fetch(10, 1))
    assert c.fetch(10, 0.2) == []


def test_publish_from_another_client_wakes_a_blocked_fetch(make: MakeBroker) -> None:
    consumer_side, producer_side = make(), make()
    c = consumer_side.consumer(["q"])
    got: list[list[Delivery]] = []
    fetcher = threading.Thread(target=lambda: got.append(c.fetch(10, 20)))
    fetcher.start()
    time.sleep(0.2)  # let the fetch block
    m = msg("q")
    producer_side.publish([m])
    fetcher.join(20)
    assert not fetcher.is_alive()
    assert ids_of(got[0]) == [m.id]


@pytest.mark.ordered
def test_fetch_serves_higher_priority_first_then_oldest_first(broker: Broker) -> None:
    ms = [msg("q", i, priority=p) for i, p in enumerate([0, 9, 5, 9, 0, 5, 1])]
    broker.publish(ms[:4])
    broker.publish(ms[4:])
    c = broker.consumer(["q"])
    first = c.fetch(2, 1)
    assert ids_of(first) == [ms[1].id, ms[3].id]
    rest = drain(c)
    assert ids_of(rest) == [ms[2].id, ms[5].id, ms[6].id, ms[0].id, ms[4].id]


@pytest.mark.ordered
def test_fetch_keeps_publish_order_within_a_priority(broker: Broker) -> None:
    ms = [msg("q", i) for i in range(50)]
    for i in range(0, 50, 10):
        broker.publish(ms[i : i + 10])
    assert ids_of(drain(broker.consumer(["q"]), 7)) == [m.id for m in ms]


@pytest.mark.ordered
def test_fetch_serves_queues_in_the_order_given(broker: Broker) -> None:
    low = [msg("low", i, priority=9) for i in range(3)]
    high = [msg("high", i) for i in range(3)]
    broker.publish(low + high)
    got = drain(broker.consumer(["high", "low"]), 4)
    assert ids_of(got) == [m.id for m in high + low]
    assert [d.queue for d in got] == ["high"] * 3 + ["low"] * 3


def test_delayed_message_is_not_fetched_before_its_eta(broker: Broker) -> None:
    eta = time.time() + 0.5
    m = msg("q", eta=eta)
    broker.publish([m])
    c = broker.consumer(["q"])
    assert c.fetch(10, 0) == []
    got = c.fetch(10, 10)  # waits for the eta
    assert time.time() >= eta
    assert ids_of(got) == [m.id]


def test_next_delayed_lists_the_soonest_first_with_their_bytes(broker: Broker) -> None:
    now = time.time()
    ms = [msg("q", i, eta=now + d) for i, d in enumerate((300, 100, 200))]
    broker.publish(ms)
    broker.publish([msg("other", eta=now + 50), msg("q")])  # another queue, a ready one
    listed = broker.next_delayed("q", 2)
    assert listed is not None, "every broker of the suite lists its delayed messages"
    assert [Message.decode(raw).id for _, raw in listed] == [ms[1].id, ms[2].id]
    assert [round(eta - now) for eta, _ in listed] == [100, 200]
    assert broker.next_delayed("empty", 5) == []


def test_delayed_message_whose_eta_has_passed_is_ready(broker: Broker) -> None:
    m = msg("q", eta=time.time() - 5)
    broker.publish([m])
    assert broker.stats(["q"])["q"].ready == 1
    assert ids_of(broker.consumer(["q"]).fetch(10, 1)) == [m.id]


def test_delayed_messages_do_not_hold_back_ready_ones(broker: Broker) -> None:
    later = [msg("q", i, eta=time.time() + 60, priority=9) for i in range(5)]
    now = msg("q")
    broker.publish([*later, now])
    assert ids_of(broker.consumer(["q"]).fetch(10, 1)) == [now.id]


# -- stats and queues ------------------------------------------------------------------------


def test_stats_count_ready_delayed_in_flight_and_dead(broker: Broker) -> None:
    broker.publish([msg("q", i) for i in range(4)] + [msg("q", eta=time.time() + 60)])
    c = broker.consumer(["q"])
    held = c.fetch(2, 1)
    c.dead_letter(held[0], "boom")
    assert broker.stats(["q"]) == {"q": QueueStats(ready=2, delayed=1, in_flight=1, dead=1)}
    assert broker.stats()["q"] == QueueStats(ready=2, delayed=1, in_flight=1, dead=1)


def test_stats_of_an_unknown_queue_are_zero(broker: Broker) -> None:
    assert broker.stats(["nowhere"]) == {"nowhere": QueueStats()}


def test_queues_lists_every_queue_published_to(broker: Broker) -> None:
    assert broker.queues() == []
    broker.publish([msg("b"), msg("a")])
    broker.publish_raw("c", [b"raw"])
    c = broker.consumer(["a", "b", "c"])
    c.ack(drain(c))
    assert broker.queues() == ["a", "b", "c"]


# -- settling --------------------------------------------------------------------------------


def test_ack_removes_messages_for_good(make: MakeBroker) -> None:
    broker = make()
    broker.publish([msg("q", i) for i in range(3)])
    c = broker.consumer(["q"])
    c.ack(c.fetch(10, 1))
    c.close()
    assert broker.stats(["q"])["q"] == QueueStats()
    assert broker.consumer(["q"]).fetch(10, 0) == []
    assert make().consumer(["q"]).fetch(10, 0) == []


def test_ack_of_a_batch_settles_only_those_deliveries(broker: Broker) -> None:
    broker.publish([msg("q", i) for i in range(5)])
    c = broker.consumer(["q"])
    held = c.fetch(5, 1)
    c.ack(held[:3])
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=2)


def test_release_makes_messages_ready_again_unchanged(broker: Broker) -> None:
    ms = [msg("q", i) for i in range(3)]
    broker.publish(ms)
    c = broker.consumer(["q"])
    held = c.fetch(2, 1)
    c.release(held)
    assert broker.stats(["q"])["q"] == QueueStats(ready=3)
    again = drain(broker.consumer(["q"]))
    assert sorted(d.raw for d in again) == sorted(m.encode() for m in ms)


def test_retry_replaces_the_delivery_by_the_next_attempt_at_its_eta(broker: Broker) -> None:
    m = msg("q", 1)
    broker.publish([m])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    eta = time.time() + 0.5
    c.retry(d, msgspec.structs.replace(m, attempt=m.attempt + 1, eta=eta))
    assert broker.stats(["q"])["q"] == QueueStats(delayed=1)
    assert c.fetch(10, 0) == []
    [again] = c.fetch(10, 10)
    assert time.time() >= eta
    retried = Message.decode(again.raw)
    assert (retried.id, retried.attempt, retried.eta) == (m.id, 1, eta)
    c.ack([again])
    assert broker.stats(["q"])["q"] == QueueStats()


def test_retry_without_delay_is_ready_at_once(broker: Broker) -> None:
    m = msg("q")
    broker.publish([m])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.retry(d, msgspec.structs.replace(m, attempt=1))
    [again] = c.fetch(1, 1)
    assert Message.decode(again.raw).attempt == 1


def test_dead_letter_keeps_the_reason_and_the_exact_raw_bytes(broker: Broker) -> None:
    garbage = b"\xc1 not msgpack \x00\xff"
    broker.publish_raw("q", [garbage])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    assert d.raw == garbage
    before = time.time()
    c.dead_letter(d, "not a hurtle message")
    [dead] = broker.dead_letters("q")
    assert (dead.queue, dead.reason, dead.raw) == ("q", "not a hurtle message", garbage)
    assert dead.failed_at >= before - 1
    assert dead.message() is None
    assert broker.stats(["q"])["q"] == QueueStats(dead=1)


# -- size limits -----------------------------------------------------------------------------

#: Above this, a test lowers a broker's limit to what it can afford to send (the check is the
#: same whatever the limit).
AFFORDABLE = 4 * 1024 * 1024


def sized(size: int, queue: str = "q", **fields: object) -> Message:
    """A message of exactly ``size`` bytes, encoded (at least 70,000)."""
    probe = msg(queue, b"x" * 70_000, **fields)
    overhead = len(probe.encode()) - 70_000
    m = msgspec.structs.replace(probe, args=(b"x" * (size - overhead),))
    assert len(m.encode()) == size
    return m


def test_a_message_over_the_size_limit_is_an_encode_error_and_nothing_is_stored(
    broker: Broker,
) -> None:
    assert 0 < broker.max_message_size <= MAX_SIZE and 0 < broker.max_result_size <= MAX_SIZE
    if broker.url.startswith("nats"):  # the server's max_payload (1 MB) less room for headers
        assert broker.max_message_size == broker.max_result_size == 1024 * 1024 - 8 * 1024
    if broker.max_message_size > AFFORDABLE:
        broker.max_message_size = 100_000
    most = broker.max_message_size
    with pytest.raises(EncodeError) as info:
        broker.publish([msg("q"), sized(most + 1)])
    text = str(info.value)
    assert f"{most + 1:,} bytes" in text and f"{most:,} bytes" in text and "'tests.add'" in text
    with pytest.raises(EncodeError):
        broker.publish_unique([sized(most + 1, unique="k")], 60)
    with pytest.raises(EncodeError):
        broker.claim_tick("q", "s", 1.0, [sized(most + 1)])
    assert broker.stats(["q"])["q"] == QueueStats()
    assert broker.last_tick("q", "s") is None
    # one at the limit is stored whole, and so is its dead letter with a long reason
    m = sized(most)
    broker.publish([m])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    assert d.raw == m.encode()
    reason = "\n".join(f"line {i} of a long traceback" for i in range(1000))
    c.dead_letter(d, reason)
    [dead] = broker.dead_letters("q")
    assert dead.raw == m.encode()
    assert dead.reason.startswith("line 0 of") and dead.reason.endswith(
        "line 999 of a long traceback"
    )


# -- dead letters ----------------------------------------------------------------------------


def _dead_letter_all(broker: Broker, ms: list[Message]) -> None:
    broker.publish(ms)
    c = broker.consumer([ms[0].queue])
    for i, d in enumerate(c.fetch(len(ms), 1)):
        c.dead_letter(d, f"reason {i}")


@pytest.mark.ordered
def test_dead_letters_are_listed_oldest_first_and_paged(broker: Broker) -> None:
    ms = [msg("q", i) for i in range(5)]
    _dead_letter_all(broker, ms)
    everything = broker.dead_letters("q")
    assert [d.reason for d in everything] == [f"reason {i}" for i in range(5)]
    assert [d.message() for d in everything] == ms
    assert len({d.id for d in everything}) == 5
    page = broker.dead_letters("q", limit=2, offset=1)
    assert [d.reason for d in page] == ["reason 1", "reason 2"]
    assert broker.dead_letters("other") == []


def test_a_dead_letter_keeps_its_reasons_lines_and_has_an_id_like_a_message_id(
    broker: Broker,
) -> None:
    reason = "task t failed:\nTraceback (most recent call last):\n  File 'x.py'\nValueError: no"
    broker.publish([msg("q")])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.dead_letter(d, reason)
    [dead] = broker.dead_letters("q")
    assert dead.reason == reason
    assert re.fullmatch("[0-9a-f]{24}", dead.id), dead.id  # the shape of ``new_id``
    assert broker.delete_dead("q", [dead.id]) == 1
    assert broker.dead_letters("q") == []


def test_delete_dead_removes_those_named_and_counts_them(broker: Broker) -> None:
    _dead_letter_all(broker, [msg("q", i) for i in range(3)])
    first, *rest = broker.dead_letters("q")
    assert broker.delete_dead("q", [first.id, "no-such-id"]) == 1
    assert broker.dead_letters("q") == rest
    assert broker.delete_dead("q", [first.id]) == 0


def test_purge_dead_removes_every_dead_letter_of_the_queue(broker: Broker) -> None:
    _dead_letter_all(broker, [msg("q", i) for i in range(3)])
    _dead_letter_all(broker, [msg("other")])
    assert broker.purge_dead("q") == 3
    assert broker.dead_letters("q") == []
    assert broker.purge_dead("q") == 0
    assert len(broker.dead_letters("other")) == 1


def test_retry_dead_puts_messages_back_as_attempt_zero_and_raw_bytes_as_they_are(
    broker: Broker,
) -> None:
    m = msg("q", attempt=3, eta=time.time() - 1)
    broker.publish([m])
    broker.publish_raw("q", [b"garbage"])
    c = broker.consumer(["q"])
    for d in c.fetch(2, 1):
        c.dead_letter(d, "failed")
    assert broker.retry_dead("q") == 2
    assert broker.dead_letters("q") == []
    got = drain(c)
    raws = {d.raw for d in got}
    assert b"garbage" in raws
    [back] = [Message.decode(r) for r in raws if r != b"garbage"]
    assert (back.id, back.attempt, back.eta) == (m.id, 0, 0.0)


def test_retry_dead_by_id_moves_only_those(broker: Broker) -> None:
    ms = [msg("q", i) for i in range(4)]
    _dead_letter_all(broker, ms)
    dead = broker.dead_letters("q")
    assert broker.retry_dead("q", [dead[1].id, dead[3].id]) == 2
    assert broker.dead_letters("q") == [dead[0], dead[2]]
    back = drain(broker.consumer(["q"]))
    assert sorted(ids_of(back)) == sorted(Message.decode(d.raw).id for d in (dead[1], dead[3]))


# -- several consumers -----------------------------------------------------------------------


@pytest.mark.parametrize("clients", ["one client", "two clients"])
def test_two_consumers_never_get_the_same_message(make: MakeBroker, clients: str) -> None:
    producer = make()
    first = make()
    second = make() if clients == "two clients" else first
    ms = [msg("q", i) for i in range(3000)]
    for i in range(0, len(ms), 500):
        producer.publish(ms[i : i + 500])
    seen: list[list[str]] = [[], []]
    go = threading.Barrier(2)

    def consume(broker: Broker, out: list[str]) -> None:
        c = broker.consumer(["q"])
        go.wait()
        while batch := c.fetch(37, 0.3):
            out += ids_of(batch)
            c.ack(batch)
        c.close()

    threads = [
        threading.Thread(target=consume, args=(b, out))
        for b, out in zip((first, second), seen, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(m.id for m in ms)
    assert producer.stats(["q"])["q"] == QueueStats()


def test_a_silent_consumers_deliveries_go_to_a_live_one(make: MakeBroker) -> None:
    a_side, b_side = make(heartbeat_timeout=0.5), make(heartbeat_timeout=0.5)
    ms = [msg("q", i) for i in range(3)]
    a_side.publish(ms)
    a = a_side.consumer(["q"])
    assert len(a.fetch(10, 1)) == 3  # then a stops heart-beating, without closing
    b = b_side.consumer(["q"])
    b.heartbeat()
    assert b.fetch(10, 0) == []
    time.sleep(0.8)
    b.heartbeat()  # records b alive, then recovers what a held
    got = b.fetch(10, 1)
    assert sorted(ids_of(got)) == sorted(m.id for m in ms)


def test_recover_returns_how_many_deliveries_went_back(make: MakeBroker) -> None:
    broker = make(heartbeat_timeout=0.3)
    broker.publish([msg("q", i) for i in range(4)])
    broker.consumer(["q"]).fetch(10, 1)
    assert broker.recover() == 0
    time.sleep(0.6)
    assert broker.recover() == 4
    assert broker.recover() == 0
    assert broker.stats(["q"])["q"] == QueueStats(ready=4)


def test_a_slow_consumer_that_keeps_heart_beating_keeps_its_deliveries(
    make: MakeBroker,
) -> None:
    a_side, b_side = make(heartbeat_timeout=0.5), make(heartbeat_timeout=0.5)
    a_side.publish([msg("q", i) for i in range(3)])
    a = a_side.consumer(["q"])
    held = a.fetch(10, 1)
    b = b_side.consumer(["q"])
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        a.heartbeat()
        b.heartbeat()
        assert b.fetch(10, 0) == []
        assert b_side.recover() == 0
        time.sleep(0.1)
    assert b_side.stats(["q"])["q"] == QueueStats(in_flight=3)
    a.ack(held)
    assert b_side.stats(["q"])["q"] == QueueStats()


def test_ack_from_a_consumer_declared_dead_leaves_the_redelivered_message(
    make: MakeBroker,
) -> None:
    a_side, b_side = make(heartbeat_timeout=0.3), make(heartbeat_timeout=0.3)
    m = msg("q")
    a_side.publish([m])
    a = a_side.consumer(["q"])
    stale = a.fetch(1, 1)
    time.sleep(0.5)
    b = b_side.consumer(["q"])
    with StallProof(0.3) as clock:  # b must stay live to the end
        b.heartbeat()
        clock.beat()
        [d] = b.fetch(1, 1)
        a.heartbeat()  # a comes back to life: too late for what it held
        a.ack(stale)
        assert b_side.stats(["q"])["q"] == QueueStats(in_flight=1)
        b.ack([d])
        assert b_side.stats(["q"])["q"] == QueueStats()


def test_what_a_consumer_takes_after_being_declared_dead_is_still_recovered(
    make: MakeBroker,
) -> None:
    a_side, b_side = make(heartbeat_timeout=0.3), make(heartbeat_timeout=0.3)
    a = a_side.consumer(["q"])
    time.sleep(0.5)
    b = b_side.consumer(["q"])
    b.heartbeat()  # declares a dead
    a_side.publish([msg("q")])
    assert len(a.fetch(1, 1)) == 1  # a still fetches, then falls silent for good
    time.sleep(0.5)
    b.heartbeat()
    assert len(b.fetch(1, 1)) == 1


def test_close_releases_what_the_consumer_held(make: MakeBroker) -> None:
    a_side, b_side = make(), make()
    ms = [msg("q", i) for i in range(3)]
    a_side.publish(ms)
    a = a_side.consumer(["q"])
    assert len(a.fetch(10, 1)) == 3
    a.close()
    assert b_side.stats(["q"])["q"] == QueueStats(ready=3)
    assert sorted(ids_of(b_side.consumer(["q"]).fetch(10, 1))) == sorted(m.id for m in ms)


@pytest.mark.ordered
def test_ack_and_fetch_records_the_acks_and_takes_the_next_batch(broker: Broker) -> None:
    ms = [msg("q", i) for i in range(5)]
    broker.publish(ms)
    c = broker.consumer(["q"])
    first = c.fetch(3, 1)
    second = c.ack_and_fetch(first, 3, 1)
    assert ids_of(second) == [m.id for m in ms[3:]]
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=2)
    assert c.ack_and_fetch(second, 3, 0.05) == []  # nothing left: the acks count all the same
    assert broker.stats(["q"])["q"] == QueueStats()


@pytest.mark.ordered
def test_prefetch_then_fetch_returns_the_next_batch_in_order(broker: Broker) -> None:
    ms = [msg("q", i) for i in range(5)]
    broker.publish(ms)
    c = broker.consumer(["q"])
    first = c.fetch(2, 1)
    c.prefetch(2)  # brokers that cannot overlap ignore it: the contract is the same
    second = c.fetch(2, 1)
    assert ids_of(first + second) == [m.id for m in ms[:4]]
    c.prefetch(10)
    c.prefetch(10)  # a second call while one is under way changes nothing
    assert ids_of(c.fetch(10, 1)) == [ms[4].id]
    c.prefetch(10)  # finds nothing: the next fetch waits as usual
    assert c.fetch(10, 0.05) == []
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=5)


def test_what_a_prefetch_took_is_held_and_released_by_close(make: MakeBroker) -> None:
    a_side, b_side = make(), make()
    ms = [msg("q", i) for i in range(3)]
    a_side.publish(ms)
    a = a_side.consumer(["q"])
    a.prefetch(10)
    a.close()
    assert b_side.stats(["q"])["q"] == QueueStats(ready=3)
    assert sorted(ids_of(b_side.consumer(["q"]).fetch(10, 1))) == sorted(m.id for m in ms)


def test_what_a_silent_consumer_prefetched_goes_to_a_live_one(make: MakeBroker) -> None:
    a_side, b_side = make(heartbeat_timeout=0.3), make(heartbeat_timeout=0.3)
    ms = [msg("q", i) for i in range(3)]
    a_side.publish(ms)
    a = a_side.consumer(["q"])
    a.prefetch(10)  # then a dies before reading the reply
    time.sleep(0.5)
    b = b_side.consumer(["q"])
    b.heartbeat()
    assert sorted(ids_of(drain(b))) == sorted(m.id for m in ms)
    del a


# -- bad input -------------------------------------------------------------------------------


def test_publish_of_an_unencodable_argument_raises_and_enqueues_nothing(broker: Broker) -> None:
    with pytest.raises(EncodeError, match=r"tests\.add"):
        broker.publish([msg("q", object())])
    assert broker.stats(["q"])["q"] == QueueStats()
    assert broker.consumer(["q"]).fetch(10, 0) == []


def test_publish_of_a_batch_with_one_bad_message_enqueues_none_of_it(broker: Broker) -> None:
    with pytest.raises(EncodeError):
        broker.publish([msg("q", 1), msg("q", 2), msg("q", object())])
    assert broker.stats(["q"])["q"] == QueueStats()
    assert broker.consumer(["q"]).fetch(10, 0) == []


# -- dead letters: bounded per queue (dead_letter_max, dead_letter_ttl) ---------------------


@pytest.fixture
def make_bounded(broker_url: str) -> Iterator[MakeBroker]:
    """Make a broker on the store with dead-letter limits of the test's choosing."""
    made: list[Broker] = []

    def factory(**limits: Any) -> Broker:
        b = make_broker(broker_url, **limits)
        made.append(b)
        return b

    yield factory
    for b in made:
        b.close()


def _dead_letter_one_by_one(broker: Broker, queue: str, n: int) -> Consumer:
    broker.publish([msg(queue, i) for i in range(n)])
    c = broker.consumer([queue])
    for i, d in enumerate(c.fetch(n, 1)):
        c.dead_letter(d, f"reason {i}")
    return c


def test_dead_letters_beyond_the_cap_drop_the_oldest_with_a_warning(
    make_bounded: MakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    broker = make_bounded(dead_letter_max=5)
    _dead_letter_one_by_one(broker, "other", 2)
    with caplog.at_level(logging.WARNING, logger="hurtle"):
        _dead_letter_one_by_one(broker, "q", 8)
    assert [d.reason for d in broker.dead_letters("q")] == [f"reason {i}" for i in range(3, 8)]
    assert broker.stats(["q"])["q"].dead == 5
    assert len(broker.dead_letters("other")) == 2  # the cap is per queue
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("dropped the 1 oldest" in w for w in warnings), warnings
    assert all("'q'" in w and "dead_letter_max (5)" in w for w in warnings), warnings


def test_dead_letters_past_the_ttl_are_dropped_at_the_next_dead_letter(
    make_bounded: MakeBroker,
) -> None:
    ttl = 0.2
    broker = make_bounded(dead_letter_ttl=ttl)
    broker.publish([msg("q", 1), msg("q", 2)])
    c = broker.consumer(["q"])
    first, second = c.fetch(2, 1)
    c.dead_letter(first, "old")
    [old] = broker.dead_letters("q")
    deadline = time.monotonic() + 10
    while time.time() <= old.failed_at + ttl + 0.01:  # until it is past the ttl
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.dead_letter(second, "new")
    assert [d.reason for d in broker.dead_letters("q")] == ["new"]


def test_dead_letter_limits_of_zero_keep_every_dead_letter(make_bounded: MakeBroker) -> None:
    broker = make_bounded(dead_letter_max=0, dead_letter_ttl=0)
    _dead_letter_one_by_one(broker, "q", 8)
    assert len(broker.dead_letters("q")) == 8


@pytest.mark.parametrize(
    "limits",
    [
        {"dead_letter_max": -1},
        {"dead_letter_max": 2.5},
        {"dead_letter_max": True},
        {"dead_letter_ttl": -1.0},
        {"dead_letter_ttl": float("nan")},
        {"dead_letter_ttl": float("inf")},
    ],
    ids=str,
)
def test_bad_dead_letter_limits_are_refused_naming_the_value(
    broker_url: str, limits: dict[str, Any]
) -> None:
    [(name, value)] = limits.items()
    with pytest.raises(ConfigurationError, match=rf"{name} must be .*got {value!r}"):
        make_broker(broker_url, **limits)


# -- redis area: settling a delivery that was taken back ------------------------------------


def _recovered_delivery(make: MakeBroker) -> tuple[Broker, Consumer, Delivery, Message]:
    """A delivery held by a consumer declared dead, whose message went back to its queue."""
    a_side, b_side = make(heartbeat_timeout=0.3), make(heartbeat_timeout=0.3)
    m = msg("q", 1)
    a_side.publish([m])
    a = a_side.consumer(["q"])
    [stale] = a.fetch(1, 1)
    deadline = time.monotonic() + 10
    while b_side.recover() == 0:  # a falls silent until its heartbeat lapses
        assert time.monotonic() < deadline, "the silent consumer was never declared dead"
        time.sleep(0.05)
    a.heartbeat()  # a comes back to life: too late for what it held
    return b_side, a, stale, m


@pytest.mark.parametrize("outcome", ["ack", "retry", "retry later", "retry elsewhere", "dead"])
def test_settling_a_delivery_recovered_from_a_consumer_declared_dead_does_nothing(
    make: MakeBroker, outcome: str
) -> None:
    broker, late, stale, m = _recovered_delivery(make)
    assert broker.stats(["q"])["q"] == QueueStats(ready=1)
    if outcome == "ack":
        late.ack([stale])
    elif outcome == "dead":
        late.dead_letter(stale, "failed, too late")
    else:
        eta = time.time() + 60 if outcome == "retry later" else 0.0
        queue = "other" if outcome == "retry elsewhere" else "q"
        late.retry(stale, msgspec.structs.replace(m, attempt=1, eta=eta, queue=queue))
    stats = broker.stats(["q", "other"])
    assert stats == {"q": QueueStats(ready=1), "other": QueueStats()}
    assert broker.dead_letters("q") == []
    [again] = drain(broker.consumer(["q", "other"]))
    assert Message.decode(again.raw) == m  # the recovered copy is the one that lives


def test_settling_a_delivery_twice_counts_the_first_outcome_only(broker: Broker) -> None:
    m = msg("q", 1)
    broker.publish([m])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.retry(d, msgspec.structs.replace(m, attempt=1))
    c.retry(d, msgspec.structs.replace(m, attempt=1))  # sent again, as after a lost reply
    c.dead_letter(d, "too late")
    assert broker.stats(["q"])["q"] == QueueStats(ready=1)
    assert broker.dead_letters("q") == []


# -- edges: one check of the fields every broker trusts, one error ---------------------------

_INVALID_FIELDS = [
    pytest.param({"priority": 10}, "priority 10", id="priority-10"),
    pytest.param({"priority": -1}, "priority -1", id="priority-minus-1"),
    pytest.param({"priority": 5.5}, "5.5", id="priority-float"),
    pytest.param({"priority": True}, "True", id="priority-bool"),
    pytest.param({"priority": "5"}, "'5'", id="priority-str"),
    pytest.param({"eta": float("nan")}, "nan", id="eta-nan"),
    pytest.param({"eta": float("inf")}, "inf", id="eta-inf"),
    pytest.param({"eta": 10**400}, "finite", id="eta-huge-int"),
    pytest.param({"eta": "tomorrow"}, "eta must be", id="eta-str"),
    pytest.param({"attempt": -1}, "attempt", id="attempt-negative"),
    pytest.param({"created": float("nan")}, "created", id="created-nan"),
]


@pytest.mark.parametrize(("fields", "named"), _INVALID_FIELDS)
def test_publish_of_a_message_with_an_invalid_field_raises_encode_error_and_stores_nothing(
    broker: Broker, fields: dict[str, object], named: str
) -> None:
    good = msg("q", 1)
    bad = msg("q", 2, **fields)
    with pytest.raises(EncodeError, match="nothing was enqueued") as info:
        broker.publish([good, bad])
    assert named in str(info.value)
    assert bad.id in str(info.value)
    assert broker.stats(["q"])["q"] == QueueStats()
    assert broker.consumer(["q"]).fetch(10, 0) == []
    assert broker.queues() == []  # not even the name of the queue


@pytest.mark.ordered
def test_every_priority_from_0_to_9_and_any_finite_eta_is_accepted(broker: Broker) -> None:
    ms = [msg("q", p, priority=p) for p in range(10)]
    broker.publish([*ms, msg("q", eta=time.time() + 3600.0), msg("q", eta=0)])
    assert broker.stats(["q"])["q"].ready == 11
    assert broker.stats(["q"])["q"].delayed == 1
    got = drain(broker.consumer(["q"]))
    assert ids_of(got)[:10] == [m.id for m in reversed(ms)]


# -- liveness: each consumer is judged by its own deadline ---------------------------------


def test_a_peer_with_a_shorter_timeout_leaves_a_live_consumers_deliveries(
    make: MakeBroker,
) -> None:
    patient_side = make(heartbeat_timeout=20)
    patient_side.publish([msg("q", i) for i in range(3)])
    patient = patient_side.consumer(["q"])
    held = patient.fetch(10, 1)
    patient.heartbeat()
    hasty_side = make(heartbeat_timeout=0.2)
    hasty = hasty_side.consumer(["q"])
    time.sleep(0.5)  # longer than the hasty timeout, far shorter than the patient one's
    assert hasty_side.recover() == 0
    hasty.heartbeat()
    assert hasty.fetch(10, 0) == []
    assert hasty_side.stats(["q"])["q"] == QueueStats(in_flight=3)
    patient.ack(held)
    assert hasty_side.stats(["q"])["q"] == QueueStats()


def test_a_consumer_with_a_short_timeout_is_recovered_by_a_patient_peer(
    make: MakeBroker,
) -> None:
    hasty_side = make(heartbeat_timeout=0.2)
    hasty_side.publish([msg("q", i) for i in range(3)])
    hasty = hasty_side.consumer(["q"])
    assert len(hasty.fetch(10, 1)) == 3  # then it falls silent
    patient_side = make(heartbeat_timeout=20)
    patient = patient_side.consumer(["q"])
    time.sleep(0.5)
    patient.heartbeat()
    assert len(drain(patient)) == 3


@pytest.mark.quarantine
def test_a_message_whose_workers_keep_dying_becomes_a_dead_letter_and_innocents_run(
    make: MakeBroker,
) -> None:
    broker = make(heartbeat_timeout=0.2)
    poison, *innocent = [msg("q", i) for i in range(6)]
    broker.publish([poison, *innocent])
    runs: dict[str, int] = {}
    acked: set[str] = set()
    for _ in range(60):
        if len(acked) == len(innocent) and broker.stats(["q"])["q"].dead:
            break
        broker.recover()
        consumer = broker.consumer(["q"])
        batch = consumer.fetch(4, 0)
        ids = ids_of(batch)
        for id_ in ids[: ids.index(poison.id) + 1 if poison.id in ids else None]:
            runs[id_] = runs.get(id_, 0) + 1
        if poison.id in ids:
            # its worker dies with the whole batch unsettled: the messages that ran before the
            # poison too (their acknowledgements were still on the way)
            time.sleep(0.3)
        else:
            consumer.ack(batch)
            acked.update(ids)
    [dead] = broker.dead_letters("q")
    assert Message.decode(dead.raw).id == poison.id
    assert "its worker died" in dead.reason
    assert runs[poison.id] <= broker.max_recoveries + 1
    assert acked == {m.id for m in innocent}
    assert broker.stats(["q"])["q"] == QueueStats(dead=1)
