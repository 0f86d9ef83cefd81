"""Celery-style aliases (``delay``, ``apply_async``) and ``expires=``: a message not started in
time is not run, it becomes a dead letter with the reason ``expired`` and its handle says so."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hurtle import Hurtle, TaskFailed
from hurtle.brokers import Delivery
from hurtle.dashboard.queries import task_lookup
from hurtle.errors import BrokerError, ConfigurationError, DecodeError, EncodeError
from hurtle.message import Message
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures


@pytest.fixture(params=["memory", "sqlite", "redis", "nats"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hurtle]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    else:
        url = str(request.getfixturevalue(f"{request.param}_url"))
    a = Hurtle(url)
    yield a
    a.close()


def _fetch_all(app: Hurtle, queue: str) -> list[Message]:
    consumer = app.broker.consumer([queue])
    try:
        got = consumer.fetch(100, 0.5)
        consumer.ack(got)
        return [Message.decode(d.raw) for d in got]
    finally:
        consumer.close()


def test_delay_is_send_and_apply_async_maps_each_option() -> None:
    app = Hurtle("memory://")
    runs: list[tuple[int, int]] = []

    @app.task(queue="q")
    def add(x: int, y: int = 0) -> None:
        runs.append((x, y))

    add.delay(1, y=2)
    add.apply_async((3,), {"y": 4}, queue="other", priority=7, expires=60)
    before = time.time()
    add.apply_async([5], countdown=30)
    add.apply_async((6,), eta=datetime.now(UTC) + timedelta(seconds=100))
    add.apply_async((7,), eta=before + 200.0, expires=datetime.now(UTC))
    (first,) = _fetch_all(app, "q")
    assert (first.args, first.kwargs, first.priority, first.expires) == ((1,), {"y": 2}, 0, 0.0)
    (other,) = _fetch_all(app, "other")
    assert (other.args, other.kwargs, other.priority) == ((3,), {"y": 4}, 7)
    assert before + 59 < other.expires < time.time() + 61
    stats = app.broker.stats(["q"])["q"]
    assert stats.delayed == 3
    with pytest.raises(ConfigurationError, match="args must be a tuple or list"):
        add.apply_async("12")
    with pytest.raises(ConfigurationError, match="kwargs must be a dict"):
        add.apply_async((1,), [("y", 2)])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="expires must be >= 0"):
        add.options(expires=-1)
    with pytest.raises(ConfigurationError, match="expires must be a number"):
        app.task(name="bad", expires="soon")(lambda: None)  # type: ignore[arg-type]


def test_apply_async_delays_by_countdown_and_eta() -> None:
    app = Hurtle("memory://")

    @app.task(queue="q")
    def noop(n: int) -> None:
        pass

    now = time.time()
    noop.apply_async((1,), countdown=30)
    noop.apply_async((2,), eta=datetime.fromtimestamp(now + 100, UTC))
    noop.apply_async((3,), eta=now + 200)
    b = app.broker
    # the memory broker keeps delayed messages by eta: read them back through a retry-free peek
    q = b._queue("q")  # type: ignore[attr-defined]
    etas = sorted(eta for eta, *_ in q.delayed)
    assert etas[0] == pytest.approx(now + 30, abs=2)
    assert etas[1] == pytest.approx(now + 100, abs=0.01)
    assert etas[2] == pytest.approx(now + 200, abs=0.01)


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_expired_messages_are_not_run_and_are_dead_lettered(app: Hurtle, pool: str) -> None:
    runs: list[str] = []

    @app.task(name="t.keep", queue="exp", store_result=True, expires=3600)
    def keep(tag: str) -> str:
        runs.append(tag)
        return tag

    @app.task(name="t.plain", queue="exp")
    def plain(tag: str) -> None:
        runs.append(tag)

    fresh = keep.send("fresh")
    stale = keep.options(expires=0).send("stale")
    plain.options(expires=0).send("stale-plain")
    plain.send("plain")
    app.worker(pool=pool, concurrency=2, burst=True).run()
    assert sorted(runs) == ["fresh", "plain"]
    assert fresh.result(5) == "fresh"
    assert stale.state() == "expired"
    with pytest.raises(TaskFailed, match="Expired"):
        stale.result(5)
    dead = app.broker.dead_letters("exp")
    assert sorted(d.reason for d in dead) == ["expired", "expired"]
    looked_up = task_lookup(app.broker, stale.id)  # the dashboard's task page
    assert (looked_up["state"], looked_up["task"], looked_up["dead_letter_id"] is not None) == (
        "expired",
        "t.keep",
        True,
    )
    messages = [m for d in dead if (m := d.message()) is not None]
    plain_id = next(m.id for m in messages if m.task == "t.plain")
    assert task_lookup(app.broker, plain_id)["state"] == "expired"
    assert sorted(m.args[0] for m in messages) == ["stale", "stale-plain"]


def test_an_expiring_message_due_after_its_expiry_never_runs(app: Hurtle) -> None:
    runs: list[int] = []

    @app.task(name="t.late", queue="exp2")
    def late(n: int) -> None:
        runs.append(n)

    late.options(delay=0.3, expires=0.1).send(1)
    late.options(delay=0.3, expires=60).send(2)
    app.worker(burst=True).run()
    assert runs == [2]
    assert [d.reason for d in app.broker.dead_letters("exp2")] == ["expired"]


def test_expired_messages_of_a_batch_cost_one_dead_letter_call() -> None:
    app = Hurtle("memory://")
    calls: list[int] = []

    @app.task(name="t.x", queue="many")
    def x(n: int) -> None:
        pass

    x.options(expires=0).send_many([(i,) for i in range(50)])
    worker = app.worker(burst=True)
    original = app.broker.consumer

    def consumer(queues: Sequence[str], worker_id: str | None = None) -> Any:
        c = original(queues, worker_id)
        many = c.dead_letter_many

        def counted(items: Sequence[tuple[Delivery, str]]) -> None:
            calls.append(len(items))
            many(items)

        c.dead_letter_many = counted  # type: ignore[method-assign]
        return c

    app.broker.consumer = consumer  # type: ignore[method-assign]
    worker.run()
    assert calls == [50]
    assert len(app.broker.dead_letters("many")) == 50


def test_cancelled_messages_are_not_run_and_say_so(app: Hurtle) -> None:
    runs: list[int] = []

    @app.task(name="t.c", queue="cq", store_result=True)
    def c(n: int) -> int:
        runs.append(n)
        return n

    handles = c.send_many([(i,) for i in range(6)])
    # another client (another process, for SQLite and Redis) cancels, before any worker runs
    other = Hurtle(app.broker.url if not app.broker.url.startswith("memory") else app.broker)
    other.cancel(handles[1].id, handles[4])
    app.worker(burst=True).run()
    assert sorted(runs) == [0, 2, 3, 5]
    assert [h.state() for h in handles] == [
        "succeeded",
        "cancelled",
        "succeeded",
        "succeeded",
        "cancelled",
        "succeeded",
    ]
    with pytest.raises(TaskFailed, match="Cancelled"):
        handles[1].result(5)
    dead = app.broker.dead_letters("cq")
    assert sorted(d.reason for d in dead) == ["cancelled", "cancelled"]
    assert sorted(m.id for d in dead if (m := d.message()) is not None) == sorted(
        [handles[1].id, handles[4].id]
    )


@pytest.mark.parametrize("pool", ["solo", "threads", "asyncio"])
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_message_waiting_in_a_worker_when_cancelled_never_runs(
    kind: str, pool: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Slow tasks: the worker fetches several at once (a solo batch, a pool's buffer) and they
    # wait there, checked against cancellations when fetched, before their tasks start. A
    # message cancelled then, not started when cancel() returned, must not run either.
    url = (
        f"sqlite:///{tmp_path / 'h.db'}"
        if kind == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    app = Hurtle(url)
    started: list[int] = []

    @app.task(name="t.slow", queue="sq", store_result=True)
    def slow(n: int) -> int:
        started.append(n)
        time.sleep(0.2)
        return n

    handles = slow.send_many([(i,) for i in range(8)])
    worker = app.worker(pool=pool, concurrency=2)
    thread = worker.run_in_thread()
    try:
        deadline = time.monotonic() + 30
        while not started:
            assert time.monotonic() < deadline, "the worker started nothing"
            time.sleep(0.005)
        other = Hurtle(url)  # another client
        other.cancel(*handles[3:])
        other.close()
        not_started = {n for n in range(3, 8) if n not in started}
        assert len(not_started) >= 3, "the machine is too slow for this test to mean anything"
        while len([h for h in handles if h.state() in ("succeeded", "cancelled")]) < 8:
            assert time.monotonic() < deadline, [h.state() for h in handles]
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(30)
    assert not_started.isdisjoint(started), f"cancelled, not started, yet ran: {started}"
    for n in not_started:
        assert handles[n].state() == "cancelled"
    assert sorted(started) == sorted(set(started))  # nothing ran twice
    assert set(started) | not_started == set(range(8))
    dead = app.broker.dead_letters("sq")
    assert {m.id for d in dead if (m := d.message()) is not None} >= {
        handles[n].id for n in not_started
    }
    assert {d.reason for d in dead} == {"cancelled"}
    app.close()


def test_a_worker_that_cannot_check_for_cancellations_runs_what_it_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a batch that outlasts the check's window asks again; with the broker unreachable the
    # worker rides it out as it did before (no cancellation can be recorded meanwhile)
    app = Hurtle("memory://")
    runs: list[int] = []

    @app.task(name="t.w", queue="wq")
    def w(i: int) -> None:
        runs.append(i)
        time.sleep(0.05)

    def unreachable(ids: Sequence[str]) -> set[str]:
        raise BrokerError("cannot reach the broker (a test)")

    def unreachable_too() -> bool:
        raise BrokerError("cannot reach the broker (a test)")

    app.broker.cancelled = unreachable  # type: ignore[method-assign]
    app.broker.cancellations_live = unreachable_too  # type: ignore[method-assign]
    w.send_many([(i,) for i in range(6)])
    app.worker(burst=True).run()
    assert sorted(runs) == list(range(6))
    assert "starting them unchecked" in caplog.text


def test_a_batch_that_outlasts_the_window_asks_about_each_id_only_while_some_are_live() -> None:
    # the re-screen of held deliveries first looks whether any cancellation is live at all
    app = Hurtle("memory://")
    looked: list[bool] = []
    asked: list[int] = []

    ran: list[int] = []

    @app.task(name="t.slow", queue="sq")
    def slow(i: int) -> None:
        ran.append(i)
        time.sleep(0.06)

    live, cancelled = app.broker.cancellations_live, app.broker.cancelled

    def looking() -> bool:
        looked.append(live())
        return looked[-1]

    def asking(ids: Sequence[str]) -> set[str]:
        asked.append(len(ids))
        return cancelled(ids)

    app.broker.cancellations_live = looking  # type: ignore[method-assign]
    app.broker.cancelled = asking  # type: ignore[method-assign]
    slow.send_many([(i,) for i in range(6)])
    app.worker(burst=True).run()
    assert looked and not any(looked)  # the batch outlasted the window: it looked, found none
    assert asked == [] and sorted(ran) == list(range(6))
    handles = slow.send_many([(i,) for i in range(10, 16)])
    app.cancel(handles[5].id)
    app.worker(burst=True).run()
    assert asked  # some live: it asked about the ids it held
    assert sorted(ran) == [*range(6), *range(10, 15)]


def test_the_worker_asks_for_cancelled_ids_only_while_some_are_live(app: Hurtle) -> None:
    asked: list[int] = []

    @app.task(name="t.n", queue="nq")
    def n(i: int) -> None:
        pass

    broker = app.broker
    original = broker.cancelled

    def counted(ids: Sequence[str]) -> set[str]:
        asked.append(len(ids))
        return original(ids)

    broker.cancelled = counted  # type: ignore[method-assign]
    n.send_many([(i,) for i in range(20)])
    app.worker(burst=True).run()
    assert asked == []
    handles = n.send_many([(i,) for i in range(20)])
    app.cancel(handles[0])
    app.worker(burst=True).run()
    assert asked and all(size > 1 for size in asked)  # whole batches, not single messages
    assert [d.reason for d in broker.dead_letters("nq")] == ["cancelled"]


def test_a_paused_queue_is_not_consumed_until_resumed(app: Hurtle) -> None:
    runs: list[str] = []

    @app.task(name="t.p", queue="pq")
    def p(tag: str) -> None:
        runs.append(tag)

    @app.task(name="t.o", queue="oq")
    def o(tag: str) -> None:
        runs.append(tag)

    p.send("paused")
    app.pause("pq")
    o.send("other")
    worker = app.worker(queues=["pq", "oq"])
    thread = worker.run_in_thread()
    deadline = time.monotonic() + 30
    while "other" not in runs:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert runs == ["other"]
    assert app.broker.stats(["pq"])["pq"].ready == 1
    app.resume("pq")
    while "paused" not in runs:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()


def test_a_burst_worker_leaves_a_paused_queue_for_later(app: Hurtle) -> None:
    runs: list[str] = []

    @app.task(name="t.b", queue="bq")
    def b(tag: str) -> None:
        runs.append(tag)

    b.send("waits")
    app.pause("bq")
    app.worker(burst=True).run()  # returns: nothing it may fetch is left
    assert runs == []
    app.resume("bq")
    app.worker(burst=True).run()
    assert runs == ["waits"]


def test_an_expiry_that_is_no_time_is_refused_at_both_ends() -> None:
    app = Hurtle("memory://")
    bad = Message(id="x", task="t", queue="q", expires=-1.0)
    with pytest.raises(EncodeError, match="expires must be >= 0"):
        app.broker.publish([bad])
    raw = msgspec.msgpack.encode(["x", "t", "q", [], {}, 0, 0, 0.0, 0.0, {}, float("nan")])
    with pytest.raises(DecodeError, match="expires"):
        Message.decode(raw)
    # no expiry costs one byte on the wire (and no unique lock two more, one a field); an old
    # message without the field reads as none
    plain = Message(id="x", task="t", queue="q")
    assert (
        len(plain.encode())
        == len(msgspec.msgpack.encode(["x", "t", "q", [], {}, 0, 0, 0.0, 0.0, {}])) + 1 + 2
    )
    assert Message.decode(msgspec.msgpack.encode(["x", "t", "q"])).expires == 0
