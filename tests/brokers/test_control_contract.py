"""Conformance of control on every broker: cancellations (``cancel``, ``cancelled``, the
``Consumer.cancellations`` flag a fetch sets), paused queues (``pause``, ``resume``, ``paused``,
``QueueStats.paused``) and dead letters recorded many at once (``dead_letter_many``), which the
worker uses for messages it does not run (expired, cancelled)."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest

from hurtle.brokers import Broker
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q", **fields: object) -> Message:
    return Message(id=new_id(), task="tests.noop", queue=queue, **fields)  # type: ignore[arg-type]


def test_cancelled_ids_are_seen_by_every_client_until_their_ttl(make: MakeBroker) -> None:
    a, b = make(), make()
    assert a.cancelled(["x", "y"]) == set()
    a.cancel(["x", "y"], 3600)
    a.cancel(["short"], 0.2)
    assert b.cancelled(["x", "z", "short"]) == {"x", "short"}
    time.sleep(0.4)
    assert b.cancelled(["x", "y", "short"]) == {"x", "y"}
    b.uncancel(["x"])
    assert a.cancelled(["x", "y"]) == {"y"}


def test_cancellations_live_is_true_whenever_a_cancellation_is(make: MakeBroker) -> None:
    """A broker may answer True when it cannot tell (the worker then asks about each id),
    never False while a cancellation is live."""
    a, b = make(), make()
    a.cancel(["short"], 0.2)
    assert b.cancellations_live() is True
    time.sleep(0.4)
    a.cancel(["x"], 3600)
    assert b.cancellations_live() is True
    b.uncancel(["x"])
    inner = getattr(b, "inner", b)  # a sharded broker answers as the one it wraps
    if type(inner).cancellations_live is not Broker.cancellations_live:  # it tells: it says
        assert b.cancellations_live() is False


def test_a_fetch_says_whether_cancellations_are_live(make: MakeBroker) -> None:
    a, b = make(), make()
    consumer = b.consumer(["q"])
    try:
        a.publish([msg(), msg()])
        batch = consumer.fetch(1, 1.0)
        assert len(batch) == 1 and consumer.cancellations is False
        a.cancel(["some-id"], 3600)
        batch += consumer.fetch(1, 1.0)
        assert len(batch) == 2 and consumer.cancellations is True
        consumer.ack(batch)
    finally:
        consumer.close()


def test_the_cancellation_flag_drops_once_every_cancellation_is_past_its_ttl(
    broker: Broker,
) -> None:
    broker.cancel(["gone-soon"], 0.2)
    time.sleep(0.4)
    broker.publish([msg()])
    consumer = broker.consumer(["q"])
    try:
        batch = consumer.fetch(10, 1.0)
        assert len(batch) == 1 and consumer.cancellations is False
        consumer.ack(batch)
    finally:
        consumer.close()


def test_cancel_refuses_a_ttl_that_is_no_duration(broker: Broker) -> None:
    for ttl in (0, -1, float("nan"), float("inf"), "1"):
        with pytest.raises(ConfigurationError, match="ttl"):
            broker.cancel(["x"], ttl)  # type: ignore[arg-type]


def test_a_paused_queue_is_fetched_by_no_client_until_resumed(make: MakeBroker) -> None:
    a, b = make(), make()
    a.publish([msg("p"), msg("p"), msg("other")])
    a.pause("p")
    assert b.paused() == {"p"}
    stats = b.stats(["p", "other"])
    assert (stats["p"].paused, stats["p"].ready, stats["other"].paused) == (True, 2, False)
    consumer = b.consumer(["p", "other"])
    try:
        got = consumer.fetch(10, 0.2)
        assert [d.queue for d in got] == ["other"]
        assert consumer.fetch(10, 0.2) == []
        b.resume("p")
        assert a.paused() == set()
        got += consumer.fetch(10, 1.0)
        assert sorted(d.queue for d in got) == ["other", "p", "p"]
        consumer.ack(got)
        assert a.stats(["p"])["p"].paused is False
    finally:
        consumer.close()


def test_delayed_messages_of_a_paused_queue_wait_for_the_resume(broker: Broker) -> None:
    broker.publish([msg("p", eta=time.time() + 0.1)])
    broker.pause("p")
    consumer = broker.consumer(["p"])
    try:
        time.sleep(0.2)
        assert consumer.fetch(10, 0.2) == []
        broker.resume("p")
        got = consumer.fetch(10, 1.0)
        assert len(got) == 1
        consumer.ack(got)
    finally:
        consumer.close()


def test_pause_and_resume_refuse_a_queue_that_is_no_name(broker: Broker) -> None:
    for bad in ("", None, 3):
        with pytest.raises(ConfigurationError, match="queue name"):
            broker.pause(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="queue name"):
            broker.resume(bad)  # type: ignore[arg-type]


def test_dead_letter_many_records_each_reason_once(broker: Broker) -> None:
    broker.publish([msg("q"), msg("q"), msg("r")])
    consumer = broker.consumer(["q", "r"])
    try:
        got = consumer.fetch(10, 1.0)
        assert len(got) == 3
        items = [(got[0], "expired"), (got[1], "cancelled"), (got[2], "expired")]
        consumer.dead_letter_many(items)
        consumer.dead_letter_many(items)  # settled already: nothing changes
        dead_q = broker.dead_letters("q")
        assert sorted(d.reason for d in dead_q) == ["cancelled", "expired"]
        assert sorted(d.raw for d in dead_q) == sorted([got[0].raw, got[1].raw])
        assert [d.reason for d in broker.dead_letters("r")] == ["expired"]
        stats = broker.stats(["q", "r"])
        assert (stats["q"].in_flight, stats["q"].dead, stats["r"].dead) == (0, 2, 1)
    finally:
        consumer.close()


def test_retrying_a_cancelled_dead_letter_lifts_its_cancellation(broker: Broker) -> None:
    m = msg("q", expires=time.time() - 1)
    broker.publish([m])
    broker.cancel([m.id], 3600)
    consumer = broker.consumer(["q"])
    try:
        got = consumer.fetch(10, 1.0)
        consumer.dead_letter_many([(got[0], "cancelled")])
        assert broker.retry_dead("q") == 1
        assert broker.cancelled([m.id]) == set()
        again = consumer.fetch(10, 1.0)
        assert [Message.decode(d.raw).expires for d in again] == [0.0]
        consumer.ack(again)
    finally:
        consumer.close()


def test_a_messages_expiry_survives_publish_retry_and_deferral(broker: Broker) -> None:
    until = time.time() + 3600
    m = msg("q", expires=until)
    broker.publish([m])
    consumer = broker.consumer(["q"])
    try:
        (first,) = consumer.fetch(10, 1.0)
        assert Message.decode(first.raw).expires == until
        retried = msgspec.structs.replace(Message.decode(first.raw), attempt=1)
        consumer.retry(first, retried)
        (second,) = consumer.fetch(10, 1.0)
        assert Message.decode(second.raw).expires == until
        consumer.defer(second, time.time())
        (third,) = consumer.fetch(10, 1.0)
        assert Message.decode(third.raw) == retried
        consumer.ack([third])
    finally:
        consumer.close()
