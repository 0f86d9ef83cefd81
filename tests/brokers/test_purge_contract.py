"""Conformance of ``Broker.purge`` on every broker: it drops the messages of one queue that wait
to be fetched (ready, delayed, and recovered ones waiting in quarantine), in one step, and
returns how many; what workers hold, the dead letters and the other queues are left alone."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hurtle.brokers import Broker, QueueStats
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q", **fields: object) -> Message:
    return Message(id=new_id(), task="tests.noop", queue=queue, **fields)  # type: ignore[arg-type]


def test_purge_drops_ready_and_delayed_messages_and_counts_them(make: MakeBroker) -> None:
    a, b = make(), make()
    later = time.time() + 3600
    a.publish([msg(), msg(priority=7), msg(eta=later), msg("other"), msg("other", eta=later)])
    assert b.purge("q") == 3
    stats = a.stats(["q", "other"])
    assert stats["q"] == QueueStats()
    assert (stats["other"].ready, stats["other"].delayed) == (1, 1)
    consumer = a.consumer(["q"])
    try:
        assert consumer.fetch(10, 0.2) == []
    finally:
        consumer.close()


def test_purge_leaves_what_workers_hold_and_the_dead_letters(make: MakeBroker) -> None:
    a, b = make(), make()
    a.publish([msg(), msg(), msg()])
    consumer = a.consumer(["q"])
    try:
        held = consumer.fetch(2, 1.0)
        assert len(held) == 2
        consumer.dead_letter(held[0], "boom")
        assert b.purge("q") == 1
        assert a.stats(["q"])["q"] == QueueStats(in_flight=1, dead=1)
        consumer.release(held[1:])  # what was held comes back: purge never dropped it
        assert a.stats(["q"])["q"] == QueueStats(ready=1, dead=1)
        again = consumer.fetch(10, 1.0)
        assert [d.raw for d in again] == [held[1].raw]
        consumer.ack(again)
        assert len(b.dead_letters("q")) == 1
    finally:
        consumer.close()


def test_a_queue_purged_takes_new_messages_and_wakes_its_consumers(make: MakeBroker) -> None:
    a, b = make(), make()
    a.publish([msg(), msg()])
    assert b.purge("q") == 2
    assert b.purge("q") == 0
    consumer = a.consumer(["q"])
    try:
        assert consumer.fetch(10, 0.2) == []
        fresh = msg()
        b.publish([fresh])
        got = consumer.fetch(10, 2.0)
        assert [Message.decode(d.raw).id for d in got] == [fresh.id]
        consumer.ack(got)
    finally:
        consumer.close()


def test_purge_of_a_paused_queue_keeps_it_paused(broker: Broker) -> None:
    broker.publish([msg(), msg()])
    broker.pause("q")
    assert broker.purge("q") == 2
    assert broker.stats(["q"])["q"] == QueueStats(paused=True)
    assert broker.paused() == {"q"}


def test_purge_of_an_unknown_queue_drops_nothing(broker: Broker) -> None:
    broker.publish([msg("kept")])
    assert broker.purge("never-seen") == 0
    assert broker.stats(["kept"])["kept"].ready == 1


def test_purge_drops_recovered_messages_waiting_in_quarantine(make: MakeBroker) -> None:
    broker = make(heartbeat_timeout=0.2)
    broker.publish([msg(), msg(), msg()])
    for _ in range(2):  # their worker dies twice: recovered a second time, they are quarantined
        consumer = broker.consumer(["q"])
        assert len(consumer.fetch(10, 1.0)) == 3
        time.sleep(0.3)
        assert broker.recover() == 3
    assert broker.stats(["q"])["q"].ready == 3
    assert broker.purge("q") == 3
    broker.recover()  # nothing left to let out
    assert broker.stats(["q"])["q"] == QueueStats()
    survivor = broker.consumer(["q"])
    try:
        assert survivor.fetch(10, 0.2) == []
    finally:
        survivor.close()


def test_purge_refuses_a_queue_that_is_no_name(broker: Broker) -> None:
    for bad in ("", None, 3):
        with pytest.raises(ConfigurationError, match="queue name"):
            broker.purge(bad)  # type: ignore[arg-type]
