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

import pytest
from dead_roads import QUEUE, ROADS, STATES, TYPES, dead_app, drain, message, on_road, send

from hurtle import ResultTimeout, TaskFailed, chain, chord, group
from hurtle.brokers import Broker, ChordStep, Consumer, Delivery, FlowStep, StoredResult
from hurtle.flow import FLOW, Flow, Link
from hurtle.ids import new_id
from hurtle.message import Message
from hurtle.workflows import FlowHandle

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
    from hurtle.records import DEAD, decode

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


# -- every road to a dead letter ends the workflow, with a real worker -------------------------


def test_every_road_to_a_dead_letter_of_a_chord_member_ends_its_chord(broker_url: str) -> None:
    """A chord per road, one member of which goes that road: each chord's handle raises
    ``TaskFailed`` naming that member at once, and no callback runs."""
    app = dead_app(broker_url)
    try:
        chords: dict[str, tuple[FlowHandle[int], Message]] = {}
        roads: dict[str, Message] = {}
        for road in ROADS:
            cb = Link(task="dead.total", queue=QUEUE, id=new_id())
            ok, member = (
                message(headers={FLOW: Flow(id=cb.id, chord=cb.id, index=i, total=2, callback=cb)})
                for i in range(2)
            )
            app.broker.publish([ok])
            roads[road] = on_road(road, member)
            chords[road] = (FlowHandle(cb.id, app, None, "dead.total"), roads[road])
        send(app, roads)
        drain(app)
        wrong: dict[str, str] = {}
        for road, (h, m) in chords.items():
            try:
                h.result(timeout=10)
            except TaskFailed as err:
                seen = (err.task, err.id, err.type, h.state())
                if seen != (m.task, m.id, TYPES[road], STATES[road]):
                    wrong[road] = repr(seen)
            except ResultTimeout:
                wrong[road] = f"still {h.state()}"
            else:
                wrong[road] = "its callback ran"
        assert not wrong, wrong
        stats = app.broker.stats([QUEUE])[QUEUE]
        assert (stats.ready, stats.dead) == (0, len(ROADS))
    finally:
        app.close()


def test_a_chord_whose_members_all_go_bad_in_one_batch_ends_with_one_of_their_failures(
    broker_url: str,
) -> None:
    """Every member of a chord fails, reject or expires, all taken in one fetch: each records
    the chord's failure under the chord's id, in the same write of the batch's records. The
    chord's handle ends with one of them (the later replaces the earlier)."""
    app = dead_app(broker_url)
    boom, reject, total = (app.tasks[f"dead.{n}"] for n in ("boom", "reject", "total"))
    stale = app.task(name="dead.stale", expires=0.001)(lambda x: x)
    try:
        h = chord([boom.s(1), reject.s(2), stale.s(3), boom.s(4)], total.s()).send()
        time.sleep(0.01)  # the stale member's expiry (1 ms after its send) passes
        drain(app)
        with pytest.raises(TaskFailed) as info:
            h.result(timeout=10)
        assert info.value.type in ("ValueError", "Reject", "Expired"), info.value
        stats = app.broker.stats([QUEUE])[QUEUE]
        assert (stats.ready, stats.dead) == (0, 4)
    finally:
        app.close()


def test_cancelled_and_expired_members_and_handles_end_their_workflows(broker_url: str) -> None:
    """A cancelled group member, chord handle and chain handle; an expired group member and
    chord member: every handle ends, with the state the member ended in."""
    app = dead_app(broker_url)
    ok, total = app.tasks["dead.ok"], app.tasks["dead.total"]
    stale = app.task(name="dead.stale", expires=0.001)(lambda x: x)
    try:
        cancelled_member = group(ok.s(1), ok.s(2)).send()
        cancelled_chord = chord([ok.s(1), ok.s(2)], total.s()).send()
        cancelled_chain = chain(ok.s(1), ok.s(), ok.s()).send()
        expired_member = group(ok.s(1), stale.s(2)).send()
        expired_chord = chord([ok.s(1), stale.s(2)], total.s()).send()
        app.cancel(cancelled_member.handles[1], cancelled_chord, cancelled_chain)
        time.sleep(0.01)  # the stale members' expiry (1 ms after their send) passes
        drain(app)
        ends = {
            "cancelled group member": (cancelled_member.handles[1], "Cancelled", "cancelled"),
            "cancelled chord": (cancelled_chord, "Cancelled", "cancelled"),
            "cancelled chain": (cancelled_chain, "Cancelled", "cancelled"),
            "expired group member": (expired_member.handles[1], "Expired", "expired"),
            "chord with an expired member": (expired_chord, "Expired", "expired"),
        }
        wrong: dict[str, str] = {}
        for what, (h, kind, state) in ends.items():
            try:
                h.result(timeout=10)
            except TaskFailed as err:
                if (err.type, h.state()) != (kind, state):
                    wrong[what] = f"{err.type} / {h.state()}"
            except ResultTimeout:
                wrong[what] = f"still {h.state()}"
            else:
                wrong[what] = "succeeded"
        assert not wrong, wrong
        assert cancelled_member.handles[0].result(timeout=10) == 1
        with pytest.raises(TaskFailed, match=r"dead\.stale"):
            expired_member.result(timeout=10)
    finally:
        app.close()


# -- workflows inside workflows, and graphs ----------------------------------------------------


def test_nested_workflows_and_graphs_run_to_their_results_and_a_deep_failure_ends_them(
    broker_url: str,
) -> None:
    """A chain of a group, a chord in a chain, a group of chains, a chord in a chord and two
    graphs (one whose node is counted in two chords) return their results; a member failing
    inside a group inside a chain, or a graph's node, fails the whole, and what waits never
    runs. The chord counts, the steps sent with each acknowledgement and the failures are the
    broker's, so each broker runs them."""
    app = dead_app(broker_url)
    ok, boom, total = (app.tasks[f"dead.{n}"] for n in ("ok", "boom", "total"))
    try:
        good = {
            "chain of a group": (chain(ok.s(1), group(ok.s(), ok.s()), total.s()), 2),
            "chord in a chain": (chain(ok.s(2), chord([ok.s(), ok.s()], total.s()), ok.s()), 4),
            "chord in a chord": (
                chord([chord([ok.s(1), ok.s(2)], total.s()), ok.s(3)], total.s()),
                6,
            ),
            "chain ending in a group": (chain(ok.s(5), group(ok.s(), ok.s())), [5, 5]),
        }
        handles = {n: (w.send(), want) for n, (w, want) in good.items()}
        chains = group(chain(ok.s(1), ok.s()), chord([ok.s(2), ok.s(3)], total.s())).send()
        diamond = app.graph(
            {"b": ["a"], "c": ["a"], "d": ["b", "c"]}, a=ok.s(3), b=ok.s(), c=ok.s(), d=total.s()
        )
        wide = app.graph(
            {"c": ["a", "b"], "d": ["a", "b"], "e": ["a"]},
            a=ok.s(1),
            b=ok.s(2),
            c=total.s(),
            d=total.s(),
            e=ok.s(),
        )
        failing = chain(ok.s(1), group(ok.s(), chain(boom.s(), ok.s())), total.s()).send()
        broken = app.graph({"b": ["a"], "c": ["b"]}, a=ok.s(7), b=boom.s(), c=ok.s())
        drain(app)
        got = {n: h.result(timeout=10) for n, (h, _) in handles.items()}
        assert got == {n: want for n, (_, want) in handles.items()}
        assert chains.result(timeout=10) == [1, 5]
        assert diamond.result(timeout=10) == {"d": 6}
        assert wide.result(timeout=10) == {"c": 3, "d": 3, "e": 1}
        for h, message in ((failing, "boom 1"), (broken, "boom 7")):
            with pytest.raises(TaskFailed) as info:
                h.result(timeout=10)
            assert (info.value.task, info.value.message) == ("dead.boom", message)
        stats = app.broker.stats([QUEUE])[QUEUE]
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 2)
    finally:
        app.close()
