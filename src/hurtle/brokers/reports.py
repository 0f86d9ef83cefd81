"""What workers tell the broker about themselves with their heartbeats, and how it is counted.

A worker's consumer carries a ``Reporter`` (set by the worker). Each heartbeat takes a
``WorkerReport`` from it and stores it in the same step as the beat, never a broker call per
task:

* the report itself (who the worker is, its pool, and its cumulative counters), kept with the
  worker's deadline and read back by ``Broker.workers()`` while that deadline has not passed;
* the counters' *increase* since the last report the broker confirmed, added to cluster totals
  kept for good (``Broker.totals()``). So the totals of a worker that died or stopped never
  vanish: they were added when they were reported. What a worker counted after its last beat
  is lost with it (at most one heartbeat interval). A beat whose reply is lost after the store
  applied it is sent again, and counted twice: totals are at-least-once, like deliveries.

Counters per queue and task: ``processed`` (taken in hand, whatever the outcome), ``failed``
(the call raised, or the message could not run), ``retried`` and ``dead_lettered`` (the outcome
of a failure).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable

import msgspec

#: The four counters, in the order ``TaskCounts`` and the tallies keep them.
KINDS = ("processed", "failed", "retried", "dead_lettered")
#: Task name counted for bytes that were no message at all.
UNDECODABLE = "(undecodable)"


class TaskCounts(msgspec.Struct, frozen=True):
    """Counters of one task on one queue."""

    queue: str
    task: str
    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0


class WorkerReport(msgspec.Struct, frozen=True):
    """One worker, as it described itself at its last heartbeat.

    ``at`` is the worker's clock when it took the report; ``deadline`` the time after which the
    broker counts it dead (filled in by ``Broker.workers()``, 0 in a report being sent).
    ``counts`` are cumulative since the worker started; ``delta`` is what the broker adds to the
    cluster totals (empty in what ``workers()`` returns).
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
        with self._lock:
            return {key: (r[0], r[1], r[2], r[3]) for key, r in self._counts.items()}


class Reporter:
    """Makes a worker's reports from its tally; ``confirm`` once the broker stored one."""

    def __init__(
        self,
        tally: Tally,
        *,
        worker_id: str,
        pool: str,
        concurrency: int,
        queues: Iterable[str],
    ) -> None:
        self.tally = tally
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
        )

    def confirm(self, report: WorkerReport) -> None:
        """The broker stored ``report``: later deltas start from its counts."""
        with self._lock:
            for c in report.counts:
                key = (c.queue, c.task)
                if self._confirmed.get(key, (0, 0, 0, 0))[0] <= c.processed:
                    self._confirmed[key] = (c.processed, c.failed, c.retried, c.dead_lettered)
