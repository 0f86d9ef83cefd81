"""What workers tell the broker about themselves with their heartbeats, and how it is counted.

A worker's consumer carries a ``Reporter`` (set by the worker). Each heartbeat takes a
``WorkerReport`` from it and stores it in the same step as the beat, never a broker call per
task:

* the report itself (who the worker is, its pool, and its cumulative counters), kept with the
  worker's deadline and read back by ``Broker.workers()`` while that deadline has not passed;
* the counters' *increase* since the last report the broker confirmed, added to cluster totals
  kept for good (``Broker.totals()``). So the totals of a worker that died or stopped never
  vanish: they were added when they were reported. A worker that stops leaves with a last
  report (``Consumer.close``): its last counts go to the totals and its report goes, so a worker
  that lived less than a heartbeat interval counts whole and is not listed once gone. What a
  worker that *died* counted after its last beat is lost with it (at most one interval). A beat
  whose reply is lost after the store applied it is sent again, and counted twice: totals are
  at-least-once, like deliveries.

Counters per queue and task: ``processed`` (taken in hand, whatever the outcome; a deferral by
a limit is no outcome: the call is counted once, when it runs), ``failed``
(the call raised, or the message could not run), ``retried`` and ``dead_lettered`` (the outcome
of a failure).

Run times per queue and task (``RunTimes``): how many calls took up to each of the fixed
``RUNTIME_BUCKETS`` (seconds), and their sum, cumulative since the worker started. The
processor times each call with one clock read and buckets a batch's times once the batch is done
(``Timings.add_batch``); the report carries them as they are, so ``/metrics`` shows the live
workers' histograms (a worker that stops takes its own with it, which Prometheus reads as a
counter reset). A report also says how many calls run ``running`` at the time it was taken.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable

import msgspec

from ..names import FAIR_MARK

#: The four counters, in the order ``TaskCounts`` and the tallies keep them.
KINDS = ("processed", "failed", "retried", "dead_lettered")
#: Task name counted for bytes that were no message at all.
UNDECODABLE = "(undecodable)"
#: Upper bounds (seconds, inclusive) of the run-time buckets; a last bucket holds the rest.
RUNTIME_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class TaskCounts(msgspec.Struct, frozen=True):
    """Counters of one task on one queue."""

    queue: str
    task: str
    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0


class RunTimes(msgspec.Struct, frozen=True):
    """Run times of one task on one queue: ``counts[i]`` calls took at most
    ``RUNTIME_BUCKETS[i]`` seconds and more than the bound before (the last: more than every
    bound); ``total`` is the sum of their run times in seconds."""

    queue: str
    task: str
    counts: tuple[int, ...] = ()
    total: float = 0.0


class WorkerReport(msgspec.Struct, frozen=True):
    """One worker, as it described itself at its last heartbeat.

    ``at`` is the worker's clock when it took the report; ``deadline`` the time after which the
    broker counts it dead (filled in by ``Broker.workers()``, 0 in a report being sent).
    ``counts`` are cumulative since the worker started; ``delta`` is what the broker adds to the
    cluster totals (empty in what ``workers()`` returns). ``running`` is how many calls ran when
    the report was taken, ``runtimes`` the run-time histograms since the worker started.
    """

    id: str
    host: str
    pid: int
    pool: str
    concurrency: int
    queues: tuple[str, ...]
    started_at: float
    at: float
    counts: tuple[TaskCounts, ...] = ()
    delta: tuple[TaskCounts, ...] = ()
    deadline: float = 0.0
    running: int = 0
    runtimes: tuple[RunTimes, ...] = ()

    def total(self, kind: str) -> int:
        return sum(getattr(c, kind) for c in self.counts)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(WorkerReport)


def encode_report(report: WorkerReport) -> bytes:
    """The stored form: the report without its delta."""
    return _encoder.encode(msgspec.structs.replace(report, delta=()))


def decode_report(raw: bytes, deadline: float) -> WorkerReport | None:
    """A stored report with its deadline, or None when the bytes are not one."""
    try:
        return msgspec.structs.replace(_decoder.decode(raw), deadline=deadline)
    except (msgspec.DecodeError, ValueError):
        return None


def merge(counts: Iterable[TaskCounts]) -> list[TaskCounts]:
    """Counts summed per (queue, task), sorted."""
    sums: dict[tuple[str, str], list[int]] = {}
    for c in counts:
        row = sums.setdefault((c.queue, c.task), [0, 0, 0, 0])
        row[0] += c.processed
        row[1] += c.failed
        row[2] += c.retried
        row[3] += c.dead_lettered
    return [TaskCounts(q, t, *row) for (q, t), row in sorted(sums.items())]


class Tally:
    """A worker's counters per (queue, task), safe to bump from several threads.

    Single outcomes take a lock (they happen on paths that already cost far more); the solo
    pool's hot path counts a batch in a local dict and adds it with ``add_many`` once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], list[int]] = {}

    def add(self, queue: str, task: str, kind: int, n: int = 1) -> None:
        """Add ``n`` to counter ``kind`` (an index into ``KINDS``) of ``task`` on ``queue``."""
        with self._lock:
            row = self._counts.get((queue, task))
            if row is None:
                row = self._counts[(queue, task)] = [0, 0, 0, 0]
            row[kind] += n

    def add_many(self, processed: dict[tuple[str, str], int]) -> None:
        """Add a batch's ``processed`` counts, keyed by (queue, task)."""
        with self._lock:
            counts = self._counts
            for key, n in processed.items():
                row = counts.get(key)
                if row is None:
                    row = counts[key] = [0, 0, 0, 0]
                row[0] += n

    def snapshot(self) -> dict[tuple[str, str], tuple[int, int, int, int]]:
        """The counters, those of a fair queue's keys (``hurtle.fair``) summed as its own."""
        with self._lock:
            rows = {key: (r[0], r[1], r[2], r[3]) for key, r in self._counts.items()}
        if not any(FAIR_MARK in q for q, _ in rows):
            return rows
        folded: dict[tuple[str, str], tuple[int, int, int, int]] = {}
        for (q, t), r in rows.items():
            key = (q.partition(FAIR_MARK)[0], t)
            was = folded.get(key)
            folded[key] = (
                r if was is None else (r[0] + was[0], r[1] + was[1], r[2] + was[2], r[3] + was[3])
            )
        return folded


class Timings:
    """A worker's run-time histograms per (queue, task), safe to add to from several threads.

    The processor keeps a batch's run times in a local list per (queue, task) and adds them here
    once per batch (``add_batch``): one lock and one pass over the times per batch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hist: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = {}

    def add_batch(
        self,
        times: dict[tuple[str, str], list[float]],
        quick: dict[tuple[str, str], tuple[int, float]] | None = None,
    ) -> None:
        """Add run times (seconds), keyed by (queue, task); and ``quick``: per key, a number of
        calls that each lasted no longer than ``RUNTIME_BUCKETS[0]``, and their sum."""
        width = len(RUNTIME_BUCKETS) + 1
        bounds = RUNTIME_BUCKETS
        with self._lock:
            if quick:
                for key, (calls, took) in quick.items():
                    row = self._hist.get(key)
                    if row is None:
                        row = self._hist[key] = [0] * width
                        self._sums[key] = 0.0
                    row[0] += calls
                    self._sums[key] += took
            for key, seconds in times.items():
                row = self._hist.get(key)
                if row is None:
                    row = self._hist[key] = [0] * width
                    self._sums[key] = 0.0
                # most calls fall in the first bucket: find the others in one C-speed pass
                first = bounds[0]
                slower = [t for t in seconds if t > first]
                row[0] += len(seconds) - len(slower)
                for t in slower:
                    row[bisect_left(bounds, t)] += 1
                self._sums[key] += sum(seconds)

    def add(self, queue: str, task: str, seconds: float) -> None:
        """Add one run time (for calls timed one by one, on paths that cost more already)."""
        self.add_batch({(queue, task): [seconds]})

    def snapshot(self) -> tuple[RunTimes, ...]:
        """The histograms, those of a fair queue's keys (``hurtle.fair``) summed as its own."""
        with self._lock:
            hist = {key: list(row) for key, row in self._hist.items()}
            sums = dict(self._sums)
        if any(FAIR_MARK in q for q, _ in hist):
            folded: dict[tuple[str, str], list[int]] = {}
            folded_sums: dict[tuple[str, str], float] = {}
            for (q, t), row in hist.items():
                key = (q.partition(FAIR_MARK)[0], t)
                was = folded.get(key)
                folded[key] = row if was is None else [a + b for a, b in zip(was, row, strict=True)]
                folded_sums[key] = folded_sums.get(key, 0.0) + sums[(q, t)]
            hist, sums = folded, folded_sums
        return tuple(
            RunTimes(q, t, tuple(row), sums[(q, t)]) for (q, t), row in sorted(hist.items())
        )


class Reporter:
    """Makes a worker's reports from its tally; ``confirm`` once the broker stored one.

    ``timings`` and ``running`` (a function, asked once per report, that says how many calls run
    now) are optional: without them a report has no run times and says 0 running.
    """

    def __init__(
        self,
        tally: Tally,
        *,
        worker_id: str,
        pool: str,
        concurrency: int,
        queues: Iterable[str],
        timings: Timings | None = None,
        running: Callable[[], int] | None = None,
    ) -> None:
        self.tally = tally
        self.timings = timings
        self.running = running
        self.worker_id = worker_id
        self.pool = pool
        self.concurrency = concurrency
        self.queues = tuple(queues)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = time.time()
        self._confirmed: dict[tuple[str, str], tuple[int, int, int, int]] = {}
        self._lock = threading.Lock()

    def report(self) -> WorkerReport:
        now = self.tally.snapshot()
        with self._lock:
            before = dict(self._confirmed)
        delta = []
        for key, row in now.items():
            old = before.get(key, (0, 0, 0, 0))
            diff = tuple(a - b for a, b in zip(row, old, strict=True))
            if any(diff):
                delta.append(TaskCounts(key[0], key[1], *diff))
        return WorkerReport(
            id=self.worker_id,
            host=self.host,
            pid=self.pid,
            pool=self.pool,
            concurrency=self.concurrency,
            queues=self.queues,
            started_at=self.started_at,
            at=time.time(),
            counts=tuple(TaskCounts(q, t, *row) for (q, t), row in sorted(now.items())),
            delta=tuple(delta),
            running=self._running(),
            runtimes=self.timings.snapshot() if self.timings is not None else (),
        )

    def _running(self) -> int:
        if self.running is None:
            return 0
        try:
            return max(int(self.running()), 0)
        except Exception:  # a report is worth more than this one figure
            return 0

    def moved(self) -> bool:
        """Whether the counters changed since the last report the broker confirmed."""
        now = self.tally.snapshot()
        with self._lock:
            confirmed = self._confirmed
            return any(confirmed.get(key) != row for key, row in now.items())

    def confirm(self, report: WorkerReport) -> None:
        """The broker stored ``report``: later deltas start from its counts."""
        with self._lock:
            for c in report.counts:
                key = (c.queue, c.task)
                if self._confirmed.get(key, (0, 0, 0, 0))[0] <= c.processed:
                    self._confirmed[key] = (c.processed, c.failed, c.retried, c.dead_lettered)
