"""``Broker.find_dead``: a message's dead letter by its id, whatever its queue, through an index
each broker keeps with its dead letters — through every road that writes or removes one."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hurtle.brokers import Broker, make_broker
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str) -> Message:
    return Message(id=new_id(), task="tests.add", queue=queue)


def dead_letter(broker: Broker, ms: list[Message], reason: str = "failed") -> None:
    """Dead-letter every message of ``ms`` (all of one queue) through a consumer."""
    broker.publish(ms)
    c = broker.consumer([ms[0].queue])
    got = c.fetch(len(ms), 1)
    assert len(got) == len(ms)
    c.dead_letter_many([(d, reason) for d in got])


@pytest.fixture
def make_bounded(broker_url: str) -> Iterator[MakeBroker]:
    made: list[Broker] = []

    def factory(**options: Any) -> Broker:
        b = make_broker(broker_url, **options)
        made.append(b)
        return b

    yield factory
    for b in made:
        b.close()


def test_a_dead_letter_is_found_by_its_message_id_in_any_queue(broker: Broker) -> None:
    by_queue = {f"q{i}": [msg(f"q{i}"), msg(f"q{i}")] for i in range(12)}
    for ms in by_queue.values():
        dead_letter(broker, ms, "boom")
    for queue, ms in by_queue.items():
        for m in ms:
            found = broker.find_dead(m.id)
            assert found is not None
            assert (found.queue, found.reason, found.message()) == (queue, "boom", m)
            assert found in broker.dead_letters(queue)
    assert broker.find_dead(new_id()) is None
    assert broker.find_dead("no such id") is None


def test_bytes_that_are_no_message_are_dead_letters_found_by_no_id(broker: Broker) -> None:
    broker.publish_raw("q", [b"\xc1 not msgpack"])
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.dead_letter(d, "not a hurtle message")
    assert len(broker.dead_letters("q")) == 1
    assert broker.find_dead("") is None


def test_a_deleted_retried_or_purged_dead_letter_is_no_longer_found(broker: Broker) -> None:
    deleted, retried, kept = msg("q"), msg("q"), msg("q")
    purged = [msg("other"), msg("other")]
    dead_letter(broker, [deleted, retried, kept])
    dead_letter(broker, purged)
    by_id = {d.message().id: d.id for d in broker.dead_letters("q")}  # type: ignore[union-attr]
    assert broker.delete_dead("q", [by_id[deleted.id]]) == 1
    assert broker.retry_dead("q", [by_id[retried.id]]) == 1
    assert broker.purge_dead("other") == 2
    assert broker.find_dead(deleted.id) is None
    assert broker.find_dead(retried.id) is None
    assert all(broker.find_dead(m.id) is None for m in purged)
    assert broker.find_dead(kept.id) is not None


def test_a_message_dead_lettered_again_is_found_by_its_latest_dead_letter(
    broker: Broker,
) -> None:
    m = msg("q")
    dead_letter(broker, [m], "first")
    assert broker.retry_dead("q") == 1
    c = broker.consumer(["q"])
    [d] = c.fetch(1, 1)
    c.dead_letter(d, "second")
    found = broker.find_dead(m.id)
    assert found is not None and found.reason == "second"


def test_dead_letters_the_cap_drops_are_no_longer_found(make_bounded: MakeBroker) -> None:
    broker = make_bounded(dead_letter_max=2)
    ms = [msg("q") for _ in range(5)]
    c = broker.consumer(["q"])
    broker.publish(ms)
    for d in c.fetch(5, 1):  # one by one: each write trims
        c.dead_letter(d, "failed")
    assert [broker.find_dead(m.id) is not None for m in ms] == [False] * 3 + [True] * 2


def test_dead_letters_past_the_ttl_are_no_longer_found(make_bounded: MakeBroker) -> None:
    ttl = 0.5
    broker = make_bounded(dead_letter_ttl=ttl)
    old, new = msg("q"), msg("q")
    broker.publish([old, new])
    c = broker.consumer(["q"])
    first, second = c.fetch(2, 1)
    c.dead_letter(first, "old")
    [dead] = broker.dead_letters("q")
    deadline = time.monotonic() + 10
    while time.time() <= dead.failed_at + ttl + 0.01:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.dead_letter(second, "new")
    assert broker.find_dead(old.id) is None
    assert broker.find_dead(new.id) is not None


def test_a_message_whose_workers_keep_dying_is_found_as_a_dead_letter(make: MakeBroker) -> None:
    broker = make(heartbeat_timeout=0.2)
    poison = msg("q")
    broker.publish([poison])
    for _ in range(60):
        if broker.stats(["q"])["q"].dead:
            break
        broker.recover()
        if broker.consumer(["q"]).fetch(1, 0):
            time.sleep(0.3)  # its worker dies holding it
    found = broker.find_dead(poison.id)
    assert found is not None and "its worker died" in found.reason
    assert found.queue == "q"
