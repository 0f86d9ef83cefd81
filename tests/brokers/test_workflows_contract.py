"""Workflows on every broker: ``Consumer.ack_flow`` settles a chain link or chord member with what
it sets off in one step, and ``Broker.chord_results`` reads a chord's results once.

The chord counter is the broker's: each member index counts once, whoever acknowledges it and
however often, and the member that completes the count publishes the callback, exactly once. A
step whose delivery its consumer no longer holds (it was recovered) changes nothing: the copy
delivered again sets it off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hurtle.brokers import Broker, ChordStep, Consumer, Delivery, FlowStep, StoredResult
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q", task: str = "tests.member", args: tuple[int, ...] = ()) -> Message:
    return Message(id=new_id(), task=task, queue=queue, args=args)


def fetch_all(c: Consumer, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + 10
    while len(got) < n:
        assert time.monotonic() < deadline, f"fetched {len(got)} of {n}"
        got += c.fetch(n - len(got), 0.2)
    return got


def member_step(d: Delivery, chord: str, index: int, total: int, callback: Message) -> FlowStep:
    return FlowStep(d, chord=ChordStep(chord, index, total, f"r{index}".encode(), 60.0, callback))


def test_ack_flow_publishes_the_next_link_stores_results_and_settles_the_delivery(
    make: MakeBroker,
) -> None:
    producer, worker = make(), make()
    first = msg()
    producer.publish([first])
    c = worker.consumer(["q", "next"])
    (d,) = fetch_all(c, 1)
    nxt = msg(queue="next", task="tests.link", args=(3,))
    c.ack_flow([FlowStep(d, (StoredResult(first.id, b"ok", 60.0),), (nxt,))])
    assert producer.get_result(first.id) == b"ok"
    stats = producer.stats(["q", "next"])
    assert (stats["q"].in_flight, stats["q"].ready, stats["next"].ready) == (0, 0, 1)
    (d2,) = fetch_all(c, 1)
    assert Message.decode(d2.raw) == nxt
    c.close()


def test_a_chord_publishes_its_callback_once_when_every_member_index_is_counted(
    make: MakeBroker,
) -> None:
    producer, w1, w2 = make(), make(), make()
    total = 7
    chord_id = new_id()
    callback = msg(queue="cb", task="tests.total")
    producer.publish([msg() for _ in range(total + 1)])  # member 1 twice
    c1, c2 = w1.consumer(["q", "cb"]), w2.consumer(["q", "cb"])
    got1 = fetch_all(c1, 3)
    got2 = fetch_all(c2, total - 2)
    # two workers, in batches, out of order; member 1 arrives twice (a message sent twice)
    c2.ack_flow([member_step(d, chord_id, 6 - i, total, callback) for i, d in enumerate(got2)])
    assert producer.stats(["cb"])["cb"].ready == 0
    assert producer.chord_results(chord_id, total) is None  # not complete
    c1.ack_flow([member_step(got1[0], chord_id, 1, total, callback)])
    c1.ack_flow([member_step(got1[1], chord_id, 1, total, callback)])  # index 1 again
    assert producer.stats(["cb"])["cb"].ready == 0
    c1.ack_flow([member_step(got1[2], chord_id, 0, total, callback)])
    assert producer.stats(["cb"])["cb"].ready == 1
    assert producer.chord_results(chord_id, total) == [f"r{i}".encode() for i in range(total)]
    assert producer.stats(["q"])["q"].in_flight == 0
    # a member counted again after the callback left (redelivered elsewhere) fires nothing
    producer.publish([msg()])
    (late,) = fetch_all(c1, 1)
    c1.ack_flow([member_step(late, chord_id, 3, total, callback)])
    (cb,) = fetch_all(c2, 1)
    assert Message.decode(cb.raw) == callback
    assert c1.fetch(10, 0.2) == [] and c2.fetch(10, 0) == []
    c1.close()
    c2.close()


def test_a_step_whose_delivery_was_recovered_changes_nothing_and_the_new_copy_counts(
    make: MakeBroker,
) -> None:
    producer, dying = make(heartbeat_timeout=0.3), make(heartbeat_timeout=0.3)
    chord_id = new_id()
    callback = msg(queue="cb", task="tests.total")
    nxt = msg(queue="next", task="tests.link")
    producer.publish([msg(), msg()])
    gone = dying.consumer(["q"])
    old = fetch_all(gone, 2)
    deadline = time.monotonic() + 10
    recovered = 0
    while recovered < 2:  # it falls silent until its heartbeat lapses
        assert time.monotonic() < deadline, "the silent consumer was never declared dead"
        recovered += producer.recover()
        time.sleep(0.05)
    keeper = producer.consumer(["q", "cb", "next"])
    again = fetch_all(keeper, 2)
    # the dead worker's late steps: no link, no count, no callback
    gone.ack_flow([member_step(old[0], chord_id, 0, 2, callback), FlowStep(old[1], publish=(nxt,))])
    stats = producer.stats(["cb", "next"])
    assert (stats["cb"].ready, stats["next"].ready) == (0, 0)
    keeper.ack_flow([member_step(again[0], chord_id, 0, 2, callback)])
    assert producer.stats(["cb"])["cb"].ready == 0  # one of two
    keeper.ack_flow([member_step(again[1], chord_id, 1, 2, callback)])
    stats = producer.stats(["cb", "q"])
    assert (stats["cb"].ready, stats["q"].in_flight) == (1, 0)
    keeper.close()


def test_forget_drops_the_chord_record_with_the_callback_acknowledgement(
    make: MakeBroker,
) -> None:
    producer, worker = make(), make()
    chord_id = new_id()
    callback = msg(queue="q", task="tests.total")
    producer.publish([msg()])
    c = worker.consumer(["q"])
    (d,) = fetch_all(c, 1)
    c.ack_flow([member_step(d, chord_id, 0, 1, callback)])
    assert producer.chord_results(chord_id, 1) == [b"r0"]
    (cb,) = fetch_all(c, 1)
    c.ack_flow([FlowStep(cb, (StoredResult(callback.id, b"sum", 60.0),), forget=chord_id)])
    assert producer.chord_results(chord_id, 1) is None
    assert producer.get_result(callback.id) == b"sum"
    assert producer.chord_results(new_id(), 3) is None  # never heard of
    c.close()


def test_a_chord_of_ten_thousand_members_counts_in_batches_and_reads_its_results_once(
    make: MakeBroker,
) -> None:
    producer, worker = make(), make()
    total = 10_000
    chord_id = new_id()
    callback = msg(queue="cb", task="tests.total")
    producer.publish([msg() for _ in range(total)])
    c = worker.consumer(["q"])
    index = 0
    while index < total:
        got = c.fetch(1000, 1)
        c.ack_flow(
            [member_step(d, chord_id, index + i, total, callback) for i, d in enumerate(got)]
        )
        index += len(got)
    assert producer.stats(["cb", "q"])["cb"].ready == 1
    results = producer.chord_results(chord_id, total)
    assert results is not None and len(results) == total
    assert results[0] == b"r0" and results[-1] == f"r{total - 1}".encode()
    c.close()


def test_a_member_the_broker_dead_letters_itself_fails_its_workflow_at_once(
    make: MakeBroker,
) -> None:
    """A member whose workers keep dying becomes a dead letter in recovery, not in a worker:
    the broker records its workflow's failure in the same step, naming it."""
    from hurtle.middleware.results import DEAD, decode
    from hurtle.workflows import FLOW, Flow

    broker = make(heartbeat_timeout=0.2)
    flow_id = new_id()
    poison = Message(id=new_id(), task="tests.member", queue="q", headers={FLOW: Flow(id=flow_id)})
    broker.publish([poison])
    for _ in range(60):
        if broker.stats(["q"])["q"].dead:
            break
        broker.recover()
        consumer = broker.consumer(["q"])
        if consumer.fetch(1, 0):
            time.sleep(0.3)  # its worker dies holding it
    [dead] = broker.dead_letters("q")
    assert "its worker died" in dead.reason
    payload = broker.get_result(flow_id)
    assert payload is not None
    record = decode(payload)
    assert (record.state, record.value) == (DEAD, ["tests.member", poison.id])
    assert "its worker died" in record.error_message
