"""Conformance of debounced tasks on every broker: ``put_latest`` records the latest message id
of debounce keys for a ttl, seen by every client, the last writer winning; and on a worker, of
the calls of one key sent within the window only the last runs (``hurtle.debounce``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from hurtle import Hurtle, Superseded
from hurtle.brokers import Broker
from hurtle.debounce import latest_value
from hurtle.ids import new_id

MakeBroker = Callable[..., Broker]
QUEUE = "debounced"
#: The window of the tests' task: sends a few milliseconds apart fall well within it.
WINDOW = 1.0


# -- the broker's record of the latest call of a key -------------------------------------------


def test_the_latest_id_of_each_key_is_read_by_every_client(make: MakeBroker) -> None:
    a, b = make(), make()
    first, second, other = new_id(), new_id(), new_id()
    assert b.get_latest("q", ["t:x", "t:y"]) == [None, None]
    a.put_latest([("q", "t:x", first), ("q", "t:y", other)], 60)
    b.put_latest([("q", "t:x", second)], 60)  # another publisher, later: the last writer wins
    assert a.get_latest("q", ["t:x", "t:none", "t:y", "t:x"]) == [second, None, other, second]
    assert a.get_latest("other", ["t:x"]) == [None]  # keys are per queue
    assert b.get_latest("q", []) == []
    a.put_latest([], 60)  # nothing to record: no error


def test_a_key_named_twice_in_one_call_keeps_the_last(broker: Broker) -> None:
    first, second, other = new_id(), new_id(), new_id()
    broker.put_latest([("q", "t:x", first), ("q", "t:y", other), ("q", "t:x", second)], 60)
    assert broker.get_latest("q", ["t:x", "t:y"]) == [second, other]


def test_keys_of_several_queues_are_recorded_in_one_call(broker: Broker) -> None:
    ids = {(f"q{n % 3}", f"t:{n}"): new_id() for n in range(30)}
    broker.put_latest([(q, k, i) for (q, k), i in ids.items()], 60)
    for queue in ("q0", "q1", "q2"):
        keys = [k for q, k in ids if q == queue]
        assert broker.get_latest(queue, [*keys, "t:missing"]) == [
            *(ids[queue, k] for k in keys),
            None,
        ]


def test_a_latest_record_is_gone_once_its_ttl_passed(broker: Broker) -> None:
    broker.put_latest([("q", "t:short", new_id()), ("q", "t:kept", "kept-id")], 60)
    broker.put_latest([("q", "t:short", new_id())], 0.2)
    time.sleep(0.5)
    assert broker.get_latest("q", ["t:short", "t:kept"]) == [None, "kept-id"]


def test_latest_records_are_kept_apart_from_progress_and_results(broker: Broker) -> None:
    id_ = new_id()
    broker.put_latest([("q", id_, "the-latest")], 60)  # a key that happens to be a message id
    assert broker.get_progress([id_]) == [None]
    assert broker.get_result(id_) is None
    assert broker.get_latest("q", [id_]) == ["the-latest"]


def test_only_records_of_other_calls_come_back(broker: Broker) -> None:
    mine, later, earlier = new_id(), new_id(), new_id()
    broker.put_latest(
        [
            ("q", "t:own", latest_value(mine, 10.0)),
            ("q", "t:later", latest_value(later, 11.0)),
            ("q", "t:earlier", latest_value(earlier, 9.0)),
            ("q", "t:prefix", latest_value(mine + "x", 12.0)),  # an id that begins with mine
            ("q", "t:bare", mine),  # a record of the id alone, as older senders wrote
        ],
        60,
    )
    keys = ["t:own", "t:later", "t:none", "t:earlier", "t:prefix", "t:bare", "t:own"]
    ids = [mine, mine, mine, mine, mine, mine, later]
    # by index: whatever is recorded, when it is not a record of that very call
    assert broker.get_other_latest("q", keys, ids) == {
        1: latest_value(later, 11.0),
        3: latest_value(earlier, 9.0),
        4: latest_value(mine + "x", 12.0),
        5: mine,
        6: latest_value(mine, 10.0),
    }
    assert broker.get_other_latest("other", keys, ids) == {}  # keys are per queue
    assert broker.get_other_latest("q", [], []) == {}
    many = [f"t:{n}" for n in range(5000)]  # more than one read of the server's at a time
    broker.put_latest([("q", k, latest_value(k, 1.0)) for k in many], 60)
    assert broker.get_other_latest("q", many, many) == {}
    assert broker.get_other_latest("q", many, [*many[:-1], "x"]) == {
        4999: latest_value(many[-1], 1.0)
    }


# -- on a worker -------------------------------------------------------------------------------


def debounced_app(broker_url: str, ran: list[tuple[str, int]], **options: Any) -> Any:
    app = Hurtle(broker_url, heartbeat_timeout=5.0)

    @app.task(
        name="deb.touch",
        queue=QUEUE,
        debounce=WINDOW,
        debounce_key="key",
        store_result=True,
        **options,
    )
    def touch(key: str, n: int) -> int:
        ran.append((key, n))
        return n

    return app, touch


def drain(app: Hurtle) -> None:
    """Run a burst worker until the queue has nothing ready, delayed or in flight."""
    app.worker(burst=True, queues=[QUEUE]).run()


def test_only_the_last_call_of_a_key_within_the_window_runs(broker_url: str) -> None:
    ran: list[tuple[str, int]] = []
    app, touch = debounced_app(broker_url, ran)
    try:
        a = [touch.send("a", n) for n in range(5)]
        b = touch.send("b", 10)
        drain(app)
        assert sorted(ran) == [("a", 4), ("b", 10)]
        assert a[-1].result(5) == 4 and b.result(5) == 10
        for h in a[:-1]:
            with pytest.raises(Superseded) as caught:
                h.result(5)
            assert caught.value.superseded_by == a[-1].id
            assert h.state() == "superseded"
        # a call after the window runs again
        again = touch.send("a", 20)
        drain(app)
        assert sorted(ran) == [("a", 4), ("a", 20), ("b", 10)]
        assert again.result(5) == 20
        stats = app.broker.stats([QUEUE])[QUEUE]
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
    finally:
        app.close()


def test_in_one_send_many_the_last_call_of_each_key_runs(broker_url: str) -> None:
    ran: list[tuple[str, int]] = []
    app, touch = debounced_app(broker_url, ran)
    try:
        handles = touch.send_many([("a", 1), ("b", 2), ("a", 3), ("a", 5), ("b", 6)])
        drain(app)
        assert sorted(ran) == [("a", 5), ("b", 6)]
        superseded = {h.id for h in handles if h.state() == "superseded"}
        assert superseded == {handles[0].id, handles[1].id, handles[2].id}
    finally:
        app.close()


def test_a_superseded_call_releases_its_unique_lock(broker_url: str) -> None:
    ran: list[tuple[str, int]] = []
    # one lock per call (its arguments differ): each call is enqueued, and holds its lock
    app, touch = debounced_app(broker_url, ran, unique_for=60)
    try:
        first, last = touch.send("a", 1), touch.send("a", 2)
        assert first.id != last.id
        drain(app)
        assert ran == [("a", 2)]
        # had the superseded call kept its lock, this would answer with its id
        assert touch.send("a", 1).id != first.id
    finally:
        app.close()
