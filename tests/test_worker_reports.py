"""What a worker counts for its heartbeat reports: per queue and task, whatever the pool."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

from helpers import BatchState
from hurtle import Hurtle
from hurtle.brokers import Delivery
from hurtle.brokers.memory import MemoryBroker
from hurtle.brokers.reports import (
    RUNTIME_BUCKETS,
    Reporter,
    Tally,
    Timings,
    decode_report,
    encode_report,
)
from hurtle.errors import BrokerError
from hurtle.worker.processor import Processor


class _Acker:
    def __init__(self) -> None:
        self.acked = 0
        self.dead = 0

    def ack(self, delivery: Delivery) -> None:
        self.acked += 1

    def ack_many(self, deliveries: list[Delivery]) -> None:
        self.acked += len(deliveries)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.dead += 1

    def dead_letter_many(self, items: list[tuple[Delivery, str]]) -> None:
        self.dead += len(items)


def test_a_mixed_batch_is_counted_per_queue_and_task() -> None:
    app = Hurtle("memory://")

    @app.task(name="add", retries=0)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="boom", retries=0)
    def boom() -> None:
        raise ValueError("no")

    def delivery(queue: str, task: str, args: tuple[int, ...] = ()) -> Delivery:
        return Delivery(queue, app.tasks[task].message(args, {}).encode(), 0)

    batch = [
        delivery("a", "add", (1, 2)),
        delivery("a", "add", (1, 2)),
        delivery("b", "add", (1, 2)),
        delivery("a", "boom"),
        delivery("a", "add", (1, 2)),
        Delivery("a", b"\xffnot a message", 0),
    ]
    acker = _Acker()
    processor = Processor(app, acker)  # type: ignore[arg-type]
    processor.process_many(batch, BatchState())

    assert processor.tally.snapshot() == {
        ("a", "add"): (3, 0, 0, 0),
        ("b", "add"): (1, 0, 0, 0),
        ("a", "boom"): (1, 1, 0, 1),
        ("a", "(undecodable)"): (1, 1, 0, 1),
    }
    assert (acker.acked, acker.dead) == (4, 2)


@pytest.mark.parametrize("n", [0, 1])
def test_an_empty_or_single_batch_counts_what_ran(n: int) -> None:
    app = Hurtle("memory://")
    app.task(name="t", retries=0)(lambda: None)
    batch = [Delivery("q", app.tasks["t"].message((), {}).encode(), 0) for _ in range(n)]
    processor = Processor(app, _Acker())  # type: ignore[arg-type]
    processor.process_many(batch, BatchState())
    assert processor.tally.snapshot() == ({("q", "t"): (1, 0, 0, 0)} if n else {})


def test_run_times_are_bucketed_per_queue_and_task_once_per_batch() -> None:
    app = Hurtle("memory://")

    @app.task(name="nap", retries=0)
    def nap(seconds: float) -> None:
        time.sleep(seconds)

    @app.task(name="boom", retries=0)
    def boom() -> None:
        raise ValueError("no")

    def delivery(queue: str, task: str, args: tuple[float, ...] = ()) -> Delivery:
        return Delivery(queue, app.tasks[task].message(args, {}).encode(), 0)

    batch = [
        delivery("a", "nap", (0.0,)),
        delivery("a", "nap", (0.03,)),
        delivery("b", "nap", (0.0,)),
        delivery("a", "boom"),
        delivery("a", "nap", (0.0,)),
    ]
    processor = Processor(app, _Acker())  # type: ignore[arg-type]
    processor.process_many(batch, BatchState())

    runtimes = {(r.queue, r.task): r for r in processor.timings.snapshot()}
    assert set(runtimes) == {("a", "nap"), ("b", "nap"), ("a", "boom")}
    assert [sum(r.counts) for r in runtimes.values()] == [1, 3, 1]  # sorted by (queue, task)
    slow = runtimes[("a", "nap")]
    assert len(slow.counts) == len(RUNTIME_BUCKETS) + 1
    # the 30 ms nap lands in a bucket whose bound is at least 30 ms; the sum holds it
    at_least_30ms = sum(n for n, b in zip(slow.counts, RUNTIME_BUCKETS, strict=False) if b >= 0.03)
    assert at_least_30ms + slow.counts[-1] >= 1
    assert slow.total >= 0.03


def test_a_long_run_counts_every_call_and_keeps_the_slow_ones_in_their_buckets() -> None:
    # fast calls are counted in spans, not timed one by one: the slow calls among them, the
    # failures and the expired messages between them still land where they belong
    app = Hurtle("memory://")

    @app.task(name="nap", retries=0)
    def nap(seconds: float) -> None:
        time.sleep(seconds)

    @app.task(name="boom", retries=0)
    def boom() -> None:
        raise ValueError("no")

    def delivery(task: str, args: tuple[float, ...] = (), expires: float = 0) -> Delivery:
        message = msgspec.structs.replace(app.tasks[task].message(args, {}), expires=expires)
        return Delivery("q", message.encode(), 0)

    batch: list[Delivery] = []
    for i in range(600):
        batch.append(delivery("nap", (0.004 if i % 100 == 50 else 0.0,)))
        if i % 150 == 7:
            batch.append(delivery("boom"))
        if i % 200 == 9:
            batch.append(delivery("nap", (0.0,), expires=1.0))  # long expired: not run
    acker = _Acker()
    processor = Processor(app, acker)  # type: ignore[arg-type]
    processor.process_many(batch, BatchState())

    runtimes = {(r.queue, r.task): r for r in processor.timings.snapshot()}
    naps, booms = runtimes[("q", "nap")], runtimes[("q", "boom")]
    assert sum(naps.counts) == 600 and sum(booms.counts) == 4
    # the six 4 ms naps are in buckets above 2.5 ms, and in the sum
    lower_bounds = (0.0, *RUNTIME_BUCKETS)
    above = sum(n for n, b in zip(naps.counts, lower_bounds, strict=False) if b >= 0.0025)
    assert above >= 6
    assert naps.total >= 6 * 0.004
    assert (acker.acked, acker.dead) == (600, 4 + 3)
    assert processor.tally.snapshot()[("q", "nap")] == (603, 0, 0, 3)  # the expired counted


def test_calls_counted_in_the_first_bucket_add_to_its_count_and_the_sum() -> None:
    timings = Timings()
    timings.add_batch({("q", "t"): [0.2]}, {("q", "t"): (1000, 0.1), ("q", "u"): (3, 0.0003)})
    hist = {(r.queue, r.task): r for r in timings.snapshot()}
    assert hist[("q", "t")].counts[0] == 1000 and sum(hist[("q", "t")].counts) == 1001
    assert hist[("q", "t")].total == pytest.approx(0.3)
    assert hist[("q", "u")].counts[0] == 3 and sum(hist[("q", "u")].counts) == 3


def test_a_report_carries_run_times_and_the_calls_running_now() -> None:
    timings = Timings()
    timings.add_batch({("q", "t"): [0.0001, 0.2, 100.0, 1000.0]})
    reporter = Reporter(
        Tally(),
        worker_id="w",
        pool="solo",
        concurrency=1,
        queues=["q"],
        timings=timings,
        running=lambda: 1,
    )
    report = reporter.report()
    assert report.running == 1
    (hist,) = report.runtimes
    assert hist.counts[0] == 1  # <= 0.5 ms
    assert hist.counts[RUNTIME_BUCKETS.index(0.25)] == 1
    assert hist.counts[RUNTIME_BUCKETS.index(300.0)] == 1
    assert hist.counts[-1] == 1  # beyond every bound
    assert hist.total == pytest.approx(1100.2001)
    stored = decode_report(encode_report(report), deadline=1.0)
    assert stored is not None and stored.runtimes == report.runtimes and stored.running == 1


def test_a_worker_reports_the_task_running_now_and_its_run_time() -> None:
    app = Hurtle("memory://", heartbeat_interval=0.05)
    started, release = threading.Event(), threading.Event()

    @app.task(name="hold", retries=0)
    def hold() -> None:
        started.set()
        release.wait(30)

    hold.send()
    worker = app.worker(queues=["default"])
    thread = worker.run_in_thread()
    try:
        assert started.wait(30)
        deadline = time.monotonic() + 30
        while not [r for r in app.broker.workers() if r.running == 1]:
            assert time.monotonic() < deadline, "no report said a task runs"
            time.sleep(0.02)
        release.set()
        while not [r for r in app.broker.workers() if r.running == 0 and r.runtimes]:
            assert time.monotonic() < deadline, "no report carried the run time"
            time.sleep(0.02)
    finally:
        release.set()
        worker.stop()
        thread.join(30)


def test_a_busy_worker_reports_its_counts_between_its_beats() -> None:
    app = Hurtle("memory://", heartbeat_interval=600, heartbeat_timeout=2400, fetch_batch_size=1)
    go = threading.Semaphore(0)  # one step per release: counted when its batch of one ends

    @app.task(name="step", retries=0)
    def step() -> None:
        assert go.acquire(timeout=30)

    app.tasks["step"].send_many([()] * 3)
    worker = app.worker(queues=["default"])
    thread = worker.run_in_thread()
    try:
        deadline = time.monotonic() + 60
        for done in (1, 2, 3):  # each step shows long before the next beat, due in 600 s
            go.release()
            while not [r for r in app.broker.workers() if r.total("processed") == done]:
                assert time.monotonic() < deadline, f"no report counted {done} steps"
                time.sleep(0.02)
            assert [c.processed for c in app.broker.totals()] == [done]
    finally:
        for _ in range(3):
            go.release()
        worker.stop()
        thread.join(30)


@pytest.mark.parametrize("pool", ["solo", "threads", "asyncio"])
def test_deferred_calls_are_not_counted_and_every_count_of_what_ran_agrees(pool: str) -> None:
    # A rate limit defers most of a burst several times over; each call runs once. The
    # worker's own count, what its heartbeats reported, and /metrics all say 100.
    app = Hurtle("memory://", heartbeat_interval=0.05)
    ran: list[int] = []

    @app.task(name="limited", rate_limit="100/s", retries=0)
    def limited(i: int) -> None:
        ran.append(i)

    limited.send_many([(i,) for i in range(100)])
    worker = app.worker(burst=True, pool=pool, concurrency=1 if pool == "solo" else 4)
    worker.run()
    assert sorted(ran) == list(range(100))
    assert worker.processed == 100
    assert worker.processor is not None
    assert worker.processor.tally.snapshot() == {("default", "limited"): (100, 0, 0, 0)}
    assert [(c.task, c.processed) for c in app.broker.totals()] == [("limited", 100)]
    pytest.importorskip("prometheus_client", reason="the dashboard extra is not installed")
    from hurtle.dashboard.metrics import registry, render

    text = render(registry(app.broker, known=app.tasks))[0].decode()
    assert 'hurtle_tasks_processed_total{queue="default",task="limited"} 100.0' in text


def test_a_report_the_broker_failed_to_store_goes_again_whole_with_the_next_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = MemoryBroker()
    consumer = broker.consumer(["q"], "w1")
    tally = Tally()
    consumer.reporter = Reporter(tally, worker_id="w1", pool="solo", concurrency=1, queues=["q"])
    tally.add("q", "t", 0, 2)

    def fail(*args: object) -> None:
        raise BrokerError("the store is down")

    monkeypatch.setattr(consumer, "_store_report_locked", fail)
    with pytest.raises(BrokerError):
        consumer.heartbeat()
    monkeypatch.undo()
    tally.add("q", "t", 0, 1)
    consumer.heartbeat()  # the 2 the failed beat did not store, and the 1 since
    assert [c.processed for c in broker.totals()] == [3]
    consumer.heartbeat()  # confirmed: counted once
    assert [c.processed for c in broker.totals()] == [3]
