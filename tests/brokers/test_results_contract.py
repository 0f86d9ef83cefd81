"""Results on every broker: storage with the acknowledgements, expiry, wake-ups, and the states a
handle reports (see ``hurtle.handles`` and ``hurtle.middleware.results``).

The state tests run a real worker (in a thread) on each broker. Nothing here asserts how long
something took; waits poll a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from dead_roads import QUEUE, ROADS, STATES, TYPES, dead_app, drain, message, on_road, send

from helpers import stored_batch
from hurtle import Handle, Hurtle, ResultTimeout, TaskFailed
from hurtle.brokers import Broker, Consumer, Delivery, StoredResult, StoredResults
from hurtle.errors import ResultError
from hurtle.ids import new_id
from hurtle.message import Message, message_id
from hurtle.middleware.results import BATCH_MOST, BATCHED_FROM
from hurtle.records import decode

MakeBroker = Callable[..., Broker]


def msg(queue: str = "q") -> Message:
    return Message(id=new_id(), task="tests.add", queue=queue, args=())


def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# -- storage -----------------------------------------------------------------------------------


def test_ack_with_results_stores_them_for_other_clients_and_settles_the_deliveries(
    make: MakeBroker,
) -> None:
    producer, worker = make(), make()
    messages = [msg() for _ in range(3)]
    producer.publish(messages)
    c = worker.consumer(["q"])
    got = c.fetch(10, 1)
    assert len(got) == 3
    c.ack(got, [StoredResult(m.id, f"value {i}".encode(), 60.0) for i, m in enumerate(messages)])
    assert [producer.get_result(m.id) for m in messages] == [b"value 0", b"value 1", b"value 2"]
    assert producer.stats(["q"])["q"].in_flight == 0
    assert c.fetch(10, 0) == []


def test_results_without_deliveries_are_stored_and_a_later_record_replaces_an_earlier_one(
    make: MakeBroker,
) -> None:
    a, b = make(), make()
    c = a.consumer(["q"])
    c.ack((), [StoredResult("m1", b"failed once", 60.0)])
    assert b.get_result("m1") == b"failed once"
    c.ack((), [StoredResult("m1", b"succeeded", 60.0)])
    assert b.get_result("m1") == b"succeeded"
    assert b.get_result("never-stored") is None


def test_records_of_one_call_under_one_id_keep_the_later_and_store_the_rest(
    make: MakeBroker,
) -> None:
    """Two records under one id in one call (the failures of two members of one chord that
    went to dead letters in the same batch, both recorded under the chord's id): the later one
    is kept, as if they came one call after the other, and the rest of the call is stored."""
    a, b = make(), make()
    c = a.consumer(["q"])
    c.ack(
        (),
        [
            StoredResult("m1", b"first", 60.0),
            StoredResult("m2", b"other", 60.0),
            StoredResult("m1", b"second", 60.0),
        ],
    )
    assert (b.get_result("m1"), b.get_result("m2")) == (b"second", b"other")
    c.ack((), StoredResults(["m3", "m4", "m3"], [b"first", b"other", b"second"], 60.0))
    assert (b.get_result("m3"), b.get_result("m4")) == (b"second", b"other")


def test_plain_acks_store_no_result(broker: Broker) -> None:
    m = msg()
    broker.publish([m])
    c = broker.consumer(["q"])
    c.ack(c.fetch(10, 1))
    assert broker.get_result(m.id) is None


def test_a_result_expires_after_its_ttl_and_others_stay(make: MakeBroker) -> None:
    a, b = make(), make()
    c = a.consumer(["q"])
    c.ack((), [StoredResult("short", b"x", 0.05), StoredResult("long", b"y", 3600.0)])
    eventually(lambda: b.get_result("short") is None)
    # a later write (which prunes expired records where the store must) keeps the live ones
    c.ack((), [StoredResult("other", b"z", 3600.0)])
    assert b.get_result("short") is None
    assert b.get_result("long") == b"y"
    assert b.get_result("other") == b"z"


def test_results_of_neighbouring_and_odd_ids_are_kept_apart_each_with_its_own_ttl(
    make: MakeBroker,
) -> None:
    # ids that differ only in their last bytes may share storage (Redis keeps them in one hash)
    a, b = make(), make()
    c = a.consumer(["q"])
    ids = ["0123456789abcdef00000001", "0123456789abcdef00000002", "a", "ab", "é", "éé1", "x" * 300]
    c.ack((), [StoredResult(i, f"value of {i}".encode(), 3600.0) for i in ids])
    c.ack((), [StoredResult("0123456789abcdef00000003", b"short", 0.05)])  # a neighbour
    assert [b.get_result(i) for i in ids] == [f"value of {i}".encode() for i in ids]
    eventually(lambda: b.get_result("0123456789abcdef00000003") is None)
    assert b.get_result("0123456789abcdef00000001") == b"value of 0123456789abcdef00000001"
    assert b.get_result("0123456789abcdef00000004") is None


def test_a_batch_spanning_buckets_in_runs_keeps_each_record_and_each_ttl(
    make: MakeBroker,
) -> None:
    # ASCII ids in runs that cross a bucket (Redis: one hash per run of ids sharing all but
    # their last three bytes), back again, and with two ttls in one bucket
    a, b = make(), make()
    c = a.consumer(["q"])
    ids = [f"0123456789abcdef0000{n:04x}" for n in (0xFFE, 0xFFF, 0x1000, 0x1001, 0x0FFD)]
    short = ids[1]
    c.ack((), [StoredResult(i, i.encode(), 0.05 if i == short else 3600.0) for i in ids])
    c.ack((), [StoredResult(i, b"same bucket", 3600.0) for i in ("q00", "q01", "q02")])
    assert [b.get_result(i) for i in ids if i != short] == [i.encode() for i in ids if i != short]
    eventually(lambda: b.get_result(short) is None)
    assert b.get_result(ids[0]) == ids[0].encode()  # its bucket's hash outlived the short one
    assert [b.get_result(i) for i in ("q00", "q01", "q02")] == [b"same bucket"] * 3
    # in columns, as a worker's batch comes: across a bucket, and in one
    across = [f"0123456789abcdef0001{n:04x}" for n in range(0xFFE, 0x1003)]
    c.ack((), StoredResults(across, [i.encode() for i in across], 3600.0))
    c.ack((), StoredResults(["é1", "é2"], [b"1", b"2"], 3600.0))
    assert [b.get_result(i) for i in across] == [i.encode() for i in across]
    assert (b.get_result("é1"), b.get_result("é2")) == (b"1", b"2")


def fetch_all(c: Consumer, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += c.fetch(n - len(got), 1)
    assert len(got) == n
    return got


def test_batches_of_records_kept_whole_read_as_the_same_records_one_by_one(
    make: MakeBroker,
) -> None:
    # a worker's batches of calls that returned: one value each where the broker keeps
    # batches whole (Broker.result_batches), read back as the records one by one
    producer, worker = make(), make()
    n = BATCH_MOST + BATCHED_FROM + 14
    messages = [
        Message(id=new_id(), task="tests.add", queue="q", args=(i, 6), kwargs={"k": [i]})
        for i in range(n)
    ]
    producer.publish(messages)
    c = worker.consumer(["q"])
    got = fetch_all(c, n)
    ids = [message_id(d.raw) for d in got]
    # a failed attempt's record came first: the batch's replaces it
    c.ack((), [StoredResult(ids[0], b"failed once", 60.0)])
    values = [{"sum": Message.decode(d.raw).args[0] + 6} for d in got]
    skipped = got[7]  # acknowledged without a record: inside a batch's range of ids
    # a batch cut in two parts, another, then one too small to be kept whole, in one
    # acknowledgement
    cut, end = BATCH_MOST + 9, BATCH_MOST + BATCHED_FROM + 9
    first, second, third = got[:7] + got[8:cut], got[cut:end], got[end:]
    parts = [
        stored_batch(first, values[:7] + values[8:cut]),
        stored_batch(second, values[cut:end]),
        stored_batch(third, values[end:]),
    ]
    assert parts[2].batches is None
    if worker.result_batches:
        assert parts[0].batches is not None and parts[1].batches is not None
        assert [b.size for b in parts[0].batches] == [BATCH_MOST, 8]
    c.ack(first + second + third, StoredResults.join(parts))
    c.ack([skipped])
    kept = [d for d in got if d is not skipped]
    records = [decode(producer.get_result(message_id(d.raw)) or b"") for d in kept]
    # each as the record of that call alone would be: its value, its message's fields
    assert [r.value for r in records] == [
        v for v, d in zip(values, got, strict=True) if d is not skipped
    ]
    for r, d in zip(records, kept, strict=True):
        m = Message.decode(d.raw)
        assert (r.state, r.task, r.queue, r.attempt, r.args_kept) == (
            "succeeded",
            "tests.add",
            "q",
            0,
            True,
        )
        assert (r.args, r.kwargs, r.enqueued) == (m.args, m.kwargs, m.created)
        assert r.finished - r.started == pytest.approx(0.25)
    assert producer.get_result(message_id(skipped.raw)) is None
    assert producer.stats(["q"])["q"].in_flight == 0
    # a batch of short life goes, as a record does
    more = [Message(id=new_id(), task="tests.add", queue="q", args=(i, 6)) for i in range(40)]
    producer.publish(more)
    got = fetch_all(c, 40)
    c.ack(got, stored_batch(got, list(range(40)), ttl=0.05))
    assert producer.get_result(message_id(got[0].raw)) is not None
    eventually(lambda: all(producer.get_result(message_id(d.raw)) is None for d in got))


def test_watchers_of_an_id_are_woken_when_its_result_is_stored(make: MakeBroker) -> None:
    waiter, worker = make(), make()
    woken = threading.Event()
    stop = waiter.watch_results(["m1"], woken.set)
    if stop is None:
        pytest.skip("this broker cannot notify: its waiters re-read with short sleeps")
    try:
        # a subscription may still be starting: store until the watcher hears of one
        c = worker.consumer(["q"])
        deadline = time.monotonic() + 10
        while not woken.wait(0.05):
            assert time.monotonic() < deadline, "the watcher was never woken"
            c.ack((), [StoredResult("m1", b"done", 60.0)])
    finally:
        stop()


def test_stopping_a_watcher_twice_leaves_the_other_watchers_of_its_id(make: MakeBroker) -> None:
    waiter, worker = make(), make()
    woken = threading.Event()
    stop = waiter.watch_results(["m1"], lambda: None)
    if stop is None:
        pytest.skip("this broker cannot notify: its waiters re-read with short sleeps")
    stop_other = waiter.watch_results(["m1"], woken.set)
    assert stop_other is not None
    try:
        stop()
        stop()
        c = worker.consumer(["q"])
        deadline = time.monotonic() + 10
        while not woken.wait(0.05):
            assert time.monotonic() < deadline, "the other watcher was never woken"
            c.ack((), [StoredResult("m1", b"done", 60.0)])
    finally:
        stop_other()


# -- handles and states, with a real worker ------------------------------------------------------


@pytest.fixture
def app(broker_url: str) -> Iterator[Hurtle]:
    app = Hurtle(broker_url, heartbeat_timeout=5.0)
    yield app
    app.close()


@pytest.fixture
def worker_of(app: Hurtle) -> Iterator[Callable[[], None]]:
    started = []

    def start() -> None:
        w = app.worker(queues=["default"])
        started.append((w, w.run_in_thread()))

    yield start
    for w, thread in started:
        w.stop()
        thread.join(30)


def test_a_handle_returns_the_value_and_reads_succeeded(
    app: Hurtle, worker_of: Callable[[], None]
) -> None:
    @app.task(store_result=True)
    def add(x: int, y: int) -> dict[str, int]:
        return {"sum": x + y}

    h = add.send(5, 6)
    assert h.state() == "pending"
    worker_of()
    assert h.result(timeout=30) == {"sum": 11}
    assert h.state() == "succeeded"
    assert app.handle(h.id).result(timeout=1) == {"sum": 11}
    many = add.send_many([(i, i) for i in range(50)])
    assert [x.result(timeout=30)["sum"] for x in many] == [2 * i for i in range(50)]


def test_a_task_that_fails_for_good_raises_task_failed_at_once_with_the_remote_error(
    app: Hurtle, worker_of: Callable[[], None]
) -> None:
    @app.task(store_result=True, retries=0)
    def boom(n: int) -> None:
        raise KeyError(f"no such thing: {n}")

    h = boom.send(7)
    worker_of()
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=30)  # raises as soon as the record lands, not at the timeout
    err = info.value
    assert (err.type, err.message, err.id) == ("KeyError", "'no such thing: 7'", h.id)
    assert "raise KeyError" in err.traceback
    assert h.state() == "dead"


def test_a_failed_attempt_with_a_retry_scheduled_reads_failed_and_result_keeps_waiting(
    app: Hurtle, worker_of: Callable[[], None]
) -> None:
    @app.task(store_result=True, retries=1, retry_delay=3600)
    def flaky() -> None:
        raise RuntimeError("try again later")

    h = flaky.send()
    worker_of()
    eventually(lambda: h.state() != "pending", timeout=30)
    assert h.state() == "failed"
    with pytest.raises(ResultTimeout):
        h.result(timeout=0.2)


def test_a_return_value_that_cannot_be_encoded_fails_the_task_naming_the_type(
    app: Hurtle, worker_of: Callable[[], None]
) -> None:
    class Opaque:
        pass

    @app.task(store_result=True, retries=0)
    def odd() -> Opaque:
        return Opaque()

    h = odd.send()
    worker_of()
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=30)
    assert info.value.type == "ResultError"
    assert "of type Opaque" in info.value.message
    # the record is written just before the dead letter, in the same flush
    eventually(lambda: app.broker.stats(["default"])["default"].dead == 1)


def test_a_result_over_the_brokers_size_limit_fails_its_call_and_the_others_are_stored(
    app: Hurtle, worker_of: Callable[[], None]
) -> None:
    # on NATS the server's real limit (a 2 MB value); elsewhere a limit a test can afford
    if app.broker.max_result_size > 4 * 1024 * 1024:
        app.broker.max_result_size = 100_000
    size = 2 * 1024 * 1024 if app.broker.url.startswith("nats") else 200_000

    @app.task(store_result=True, retries=0)
    def blob(n: int) -> bytes:
        return b"x" * n

    big, *small = blob.send_many([(size,), *[(i,) for i in range(40)]])
    worker_of()
    with pytest.raises(TaskFailed) as info:
        big.result(timeout=30)
    assert info.value.type == "ResultError"
    assert f"{app.broker.max_result_size:,} bytes" in info.value.message
    assert "max_result_size" in info.value.message
    assert [h.result(timeout=30) for h in small] == [b"x" * i for i in range(40)]
    eventually(lambda: app.broker.stats(["default"])["default"].dead == 1)
    assert app.broker.stats(["default"])["default"].in_flight == 0


def test_aresult_waits_without_blocking_the_event_loop(
    app: Hurtle, worker_of: Callable[[], None]
) -> None:
    @app.task(store_result=True)
    def double(x: int) -> int:
        return 2 * x

    handles = [double.send(i) for i in range(5)]

    async def main() -> tuple[list[int], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        worker_of()
        values = await asyncio.gather(*(h.aresult(timeout=30) for h in handles))
        ticker.cancel()
        return list(values), ticks

    values, ticks = asyncio.run(main())
    assert values == [0, 2, 4, 6, 8]
    assert ticks > 1  # the loop kept running while the results were awaited


def test_result_on_a_task_that_keeps_no_results_raises_at_once(app: Hurtle) -> None:
    @app.task
    def plain() -> int:
        return 1

    h = plain.send()
    with pytest.raises(ResultError, match="does not keep results"):
        h.result(timeout=3600)  # no worker runs: only an immediate error ends this


def test_a_result_that_never_comes_raises_result_timeout(app: Hurtle) -> None:
    @app.task(store_result=True)
    def never() -> None:
        pass

    h = never.send()
    with pytest.raises(ResultTimeout) as info:
        h.result(timeout=0.1)
    assert isinstance(info.value, TimeoutError)
    assert "pending" in str(info.value)


def test_app_store_results_applies_to_every_task_and_result_ttl_to_its_records(
    broker_url: str,
) -> None:
    app = Hurtle(broker_url, store_results=True, result_ttl=2.0)
    try:

        @app.task
        def one() -> int:
            return 1

        @app.task(store_result=False)
        def quiet() -> int:
            return 2

        assert (one.store_result, one.result_ttl, quiet.store_result) == (True, 2.0, False)
        h = one.send()
        w = app.worker(queues=["default"])
        t = w.run_in_thread()
        try:
            eventually(lambda: h.state() == "succeeded", timeout=30)
            eventually(lambda: h.state() == "pending")  # expired
        finally:
            w.stop()
            t.join(30)
        assert isinstance(h, Handle)
    finally:
        app.close()


def test_every_road_to_a_dead_letter_ends_the_handle_of_a_task_that_keeps_results(
    broker_url: str,
) -> None:
    """Failed for good, rejected, unfit, expired, cancelled, of an unknown task (the sender may
    keep its results), undecodable: each handle raises ``TaskFailed`` at once, never pending."""
    app = dead_app(broker_url, store_result=True)
    try:
        roads = {road: on_road(road, message()) for road in ROADS}
        send(app, roads)
        drain(app)
        wrong: dict[str, str] = {}
        for road, m in roads.items():
            h = app.handle(m.id, app.tasks.get(m.task))
            try:
                h.result(timeout=10)
            except TaskFailed as err:
                if (err.type, h.state()) != (TYPES[road], STATES[road]):
                    wrong[road] = f"{err.type} / {h.state()}"
            except ResultTimeout:
                wrong[road] = f"still {h.state()}"
            else:
                wrong[road] = "succeeded"
        assert not wrong, wrong
        assert app.broker.stats([QUEUE])[QUEUE].dead == len(ROADS)
    finally:
        app.close()
