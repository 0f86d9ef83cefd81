"""Conformance of ``Broker.forget`` on every broker: an empty queue's name leaves the known
queues (``queues()``, ``stats()``) until a message is published to it again; a queue that holds
messages (ready, delayed, in flight, dead) or is paused is kept, and nothing changes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hurtle.brokers import Broker, QueueStats
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q", **fields: object) -> Message:
    return Message(id=new_id(), task="tests.noop", queue=queue, **fields)  # type: ignore[arg-type]


def test_an_emptied_queue_is_forgotten_and_known_again_with_its_next_message(
    make: MakeBroker,
) -> None:
    a, b = make(), make()
    a.publish([msg(), msg("kept")])
    assert b.purge("q") == 1
    assert b.forget("q") is True
    assert "q" not in b.queues() and "q" not in a.queues()
    assert set(b.stats()) == {"kept"}
    assert b.stats(["q"])["q"] == QueueStats()
    assert b.forget("never-seen") is True  # not known: nothing to do
    make().publish([msg()])
    assert "q" in b.queues()
    assert b.stats(["q"])["q"].ready == 1
    b.publish([msg("other")])  # the one that forgot it publishes: known again
    assert b.purge("other") == 1 and b.forget("other") is True
    b.publish([msg("other")])
    assert "other" in a.queues()


def test_a_client_that_published_before_the_queue_was_forgotten_makes_it_known_again(
    make: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite a broker object writes a queue's name again KNOWN_REFRESH seconds after it last
    did (0 here): until then, what it publishes to a queue another process forgot is fetched
    and counted, but that queue is not listed."""
    from hurtle.brokers.sqlite import broker as sqlite_broker

    monkeypatch.setattr(sqlite_broker, "KNOWN_REFRESH", 0.0)
    a, b = make(), make()
    a.publish([msg()])
    assert b.purge("q") == 1 and b.forget("q") is True
    a.publish([msg()])
    assert "q" in b.queues()


def test_a_forgotten_queue_still_delivers_what_is_published_to_it(make: MakeBroker) -> None:
    a = make()
    a.publish([msg()])
    consumer = a.consumer(["q"])
    try:
        consumer.ack(consumer.fetch(10, 1.0))
        assert a.forget("q") is True
        a.publish([msg(), msg()])
        got = consumer.fetch(10, 1.0)
        assert len(got) == 2
        consumer.ack(got)
    finally:
        consumer.close()


@pytest.mark.parametrize("holding", ["ready", "delayed", "in_flight", "dead", "paused"])
def test_a_queue_that_holds_messages_or_is_paused_is_not_forgotten(
    make: MakeBroker, holding: str
) -> None:
    a = make()
    consumer = a.consumer(["q"])
    try:
        if holding == "paused":
            a.pause("q")
        else:
            a.publish([msg(eta=time.time() + 3600 if holding == "delayed" else 0.0)])
        if holding in ("in_flight", "dead"):
            (held,) = consumer.fetch(10, 1.0)
            if holding == "dead":
                consumer.dead_letter(held, "boom")
        before = a.stats(["q"])["q"]
        assert a.forget("q") is False
        assert "q" in a.queues()
        assert a.stats(["q"])["q"] == before
    finally:
        consumer.close()
