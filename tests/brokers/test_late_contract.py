"""Late outcomes on every broker: a worker taken for dead while it lives (its deadline lapsed:
paused, or cut off from the store) settles what it held once it is back, after another worker
recovered those messages, ran them and stored their records. Its settlement is ignored, and so
is what rides with it: the records stored are the redelivered copies' (``base``, "Late
outcomes").

Worker A fetches and goes silent past its heartbeat timeout; worker B recovers, fetches the same
messages and acknowledges them with its records; then A acknowledges with its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from helpers import stored_batch
from hurtle.brokers import Broker, Consumer, Delivery, FlowStep, StoredResult
from hurtle.ids import new_id
from hurtle.message import Message, message_id
from hurtle.middleware.results import BATCHED_FROM
from hurtle.records import decode

MakeBroker = Callable[..., Broker]


def take_over(broker: Broker, late: list[Delivery]) -> tuple[Consumer, list[Delivery]]:
    """A second worker that gets the messages of ``late`` once their worker is taken for dead
    (its deadline lapses: it does not beat), fetched again."""
    fresh = broker.consumer(["q"])
    wanted = {message_id(d.raw) for d in late}
    got: list[Delivery] = []
    deadline = time.monotonic() + 20
    while {message_id(d.raw) for d in got} != wanted:
        assert time.monotonic() < deadline, f"recovered {len(got)} of {len(wanted)}"
        fresh.heartbeat()  # recovers what the silent worker held, once its deadline passed
        got += fresh.fetch(len(wanted), 0.2)
    return fresh, got


def publish(broker: Broker, n: int) -> list[Message]:
    messages = [Message(id=new_id(), task="tests.add", queue="q", args=(i, 6)) for i in range(n)]
    broker.publish(messages)
    return messages


def fetch_all(c: Consumer, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += c.fetch(n - len(got), 1)
    assert len(got) == n
    return got


def test_the_record_of_a_late_acknowledgement_does_not_replace_the_redelivered_copys(
    make: MakeBroker,
) -> None:
    broker = make(heartbeat_timeout=0.3)
    [m] = publish(broker, 1)
    stale = broker.consumer(["q"])
    late = fetch_all(stale, 1)
    fresh, again = take_over(broker, late)
    fresh.ack(again, [StoredResult(m.id, b"X: the redelivered copy's", 60.0)])
    assert broker.get_result(m.id) == b"X: the redelivered copy's"
    stale.ack(late, [StoredResult(m.id, b"Y: the late one's", 60.0)])
    assert broker.get_result(m.id) == b"X: the redelivered copy's"
    stats = broker.stats(["q"])["q"]
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


def test_a_late_batch_of_records_stored_whole_does_not_replace_the_redelivered_ones(
    make: MakeBroker,
) -> None:
    # a worker's batch of calls that returned (one value where the broker keeps batches whole)
    broker = make(heartbeat_timeout=0.3)
    n = BATCHED_FROM + 8
    messages = publish(broker, n)
    stale = broker.consumer(["q"])
    late = fetch_all(stale, n)
    fresh, again = take_over(broker, late)
    again.sort(key=lambda d: message_id(d.raw))  # in the order they were published
    fresh.ack(again, stored_batch(again, ["X"] * n))
    late.sort(key=lambda d: message_id(d.raw))
    stale.ack(late, stored_batch(late, ["Y"] * n))
    values = [decode(broker.get_result(m.id) or b"").value for m in messages]
    assert values == ["X"] * n


def test_only_the_late_deliveries_of_an_acknowledgement_lose_their_records(
    make: MakeBroker,
) -> None:
    # the same acknowledgement settles a delivery taken since (held: its record is stored)
    # and a late one (not held: the redelivered copy's record stays)
    broker = make(heartbeat_timeout=0.3)
    [m] = publish(broker, 1)
    stale = broker.consumer(["q"])
    late = fetch_all(stale, 1)
    fresh, again = take_over(broker, late)
    fresh.ack(again, [StoredResult(m.id, b"X", 60.0)])
    [newer] = publish(broker, 1)
    taken = fetch_all(stale, 1)  # back: it fetches again, under the same worker id
    stale.ack(
        [*late, *taken],
        [
            StoredResult(m.id, b"Y", 60.0),
            StoredResult(newer.id, b"held", 60.0),
            StoredResult("no-delivery", b"stored as it is", 60.0),
        ],
    )
    assert broker.get_result(m.id) == b"X"
    assert broker.get_result(newer.id) == b"held"
    assert broker.get_result("no-delivery") == b"stored as it is"
    assert broker.stats(["q"])["q"].in_flight == 0


def test_a_late_workflow_step_sets_nothing_off(make: MakeBroker) -> None:
    broker = make(heartbeat_timeout=0.3)
    [m] = publish(broker, 1)
    stale = broker.consumer(["q"])
    late = fetch_all(stale, 1)
    fresh, again = take_over(broker, late)
    nxt = Message(id=new_id(), task="tests.next", queue="next")
    fresh.ack_flow([FlowStep(again[0], (StoredResult(m.id, b"X", 60.0),), (nxt,))])
    late_next = Message(id=new_id(), task="tests.next", queue="next")
    stale.ack_flow([FlowStep(late[0], (StoredResult(m.id, b"Y", 60.0),), (late_next,))])
    assert broker.get_result(m.id) == b"X"
    reader = broker.consumer(["next"])
    assert [message_id(d.raw) for d in fetch_all(reader, 1)] == [nxt.id]
    assert reader.fetch(10, 0.2) == []
