"""Read-only views of a broker, as plain JSON-ready dicts: the dashboard, its API, ``/metrics``
and ``hurtle status`` all read through here.

Nothing here imports Starlette, so ``hurtle status`` works without the ``dashboard`` extra.

Throughput is worked out from workers' reports (``brokers/reports.py``): each worker's rate is
the change of its counters between its two latest reports divided by the time between them, and
holds until its next report; the cluster's rate is the sum. So the chart moves in steps of a
heartbeat interval per worker (``HURTLE_HEARTBEAT_INTERVAL``, a quarter of the heartbeat timeout
unless set).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from ..brokers import Broker, DeadLetter, QueueStats
from ..brokers.reports import KINDS, TaskCounts, WorkerReport, merge

#: Points of throughput history the dashboard keeps (one a second at most).
HISTORY = 300


def queue_names(broker: Broker, declared: Iterable[str] = ()) -> list[str]:
    """Every queue the broker has seen, and those the app's tasks name."""
    return sorted(set(declared) | set(broker.queues()))


def queue_stats(broker: Broker, declared: Iterable[str] = ()) -> dict[str, QueueStats]:
    """Counts per queue: ready, delayed, in flight, dead."""
    return broker.stats(queue_names(broker, declared))


def queue_rows(stats: dict[str, QueueStats]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "ready": s.ready,
            "delayed": s.delayed,
            "in_flight": s.in_flight,
            "dead": s.dead,
        }
        for name, s in stats.items()
    ]


def worker_row(report: WorkerReport) -> dict[str, Any]:
    return {
        "id": report.id,
        "host": report.host,
        "pid": report.pid,
        "pool": report.pool,
        "concurrency": report.concurrency,
        "queues": list(report.queues),
        "started_at": report.started_at,
        "last_heartbeat": report.at,
        "deadline": report.deadline,
        **{kind: report.total(kind) for kind in KINDS},
    }


def count_rows(counts: Iterable[TaskCounts]) -> list[dict[str, Any]]:
    return [msgspec.structs.asdict(c) for c in counts]


def sum_counts(counts: Iterable[TaskCounts]) -> dict[str, int]:
    rows = list(counts)
    return {kind: sum(getattr(c, kind) for c in rows) for kind in KINDS}


def dead_letter_row(dead: DeadLetter) -> dict[str, Any]:
    """A dead letter for people: its reason's first line, the rest (a traceback) apart, and
    what the message was, if its bytes are one."""
    summary, _, trace = dead.reason.partition("\n")
    message = dead.message()
    row: dict[str, Any] = {
        "id": dead.id,
        "queue": dead.queue,
        "reason": summary,
        "traceback": trace,
        "failed_at": dead.failed_at,
        "message_id": None,
        "task": None,
        "attempts": None,
        "args": None,
        "kwargs": None,
        "size": len(dead.raw),
    }
    if message is not None:
        row.update(
            message_id=message.id,
            task=message.task,
            attempts=message.attempt + 1,
            args=_json_safe(list(message.args)),
            kwargs=_json_safe(message.kwargs),
        )
    return row


def _json_safe(value: Any) -> Any:
    """``value`` as JSON types; what has none (bytes, timestamps…) as its ``repr``."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, ValueError, msgspec.EncodeError):
        return repr(value)


class Throughput:
    """Tasks per second of the cluster, from workers' successive reports (see the module doc).

    Shared by every viewer of one dashboard: ``sample`` reads the broker at most once per
    ``every`` seconds and appends a point to ``history``.
    """

    def __init__(self, broker: Broker, every: float = 1.0) -> None:
        self.broker = broker
        self.every = every
        self.history: deque[dict[str, float]] = deque(maxlen=HISTORY)
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int, int]] = {}  # worker -> (at, processed, failed)
        self._rates: dict[str, tuple[float, float]] = {}
        self._spans: dict[str, float] = {}  # worker -> seconds between its last two reports
        self._seen: dict[str, float] = {}  # worker -> when this process saw its last report
        self._workers: list[WorkerReport] = []
        self._sampled = 0.0

    def rates(
        self, reports: Iterable[WorkerReport], now: float | None = None
    ) -> tuple[float, float]:
        """Fold in the latest reports; the cluster's (processed, failed) per second."""
        now = time.time() if now is None else now
        seen = set()
        for r in reports:
            seen.add(r.id)
            processed, failed = r.total("processed"), r.total("failed")
            last = self._last.get(r.id)
            if last is None:
                self._last[r.id] = (r.at, processed, failed)
                self._seen[r.id] = now
                self._rates.setdefault(r.id, (0.0, 0.0))
            elif r.at > last[0]:
                span = self._spans[r.id] = r.at - last[0]
                self._rates[r.id] = (
                    max(processed - last[1], 0) / span,
                    max(failed - last[2], 0) / span,
                )
                self._last[r.id] = (r.at, processed, failed)
                self._seen[r.id] = now
        for gone in set(self._last) - seen:
            del self._last[gone]
            self._rates.pop(gone, None)
            self._spans.pop(gone, None)
            self._seen.pop(gone, None)
        # a worker that missed two reports (stuck, or dead and not yet expired) counts for 0;
        # judged by this process's clock, since workers' clocks may be set differently
        live = [
            rate
            for worker_id, rate in self._rates.items()
            if now - self._seen[worker_id] <= 2 * self._spans.get(worker_id, math.inf) + self.every
        ]
        return sum(p for p, _ in live), sum(f for _, f in live)

    def sample(self) -> tuple[dict[str, float], list[WorkerReport]]:
        """The newest point ``{"t", "processed", "failed"}`` and the live workers' reports."""
        with self._lock:
            now = time.time()
            if self.history and now - self._sampled < self.every:
                return self.history[-1], self._workers
            self._workers = self.broker.workers()
            processed, failed = self.rates(self._workers, now)
            point = {
                "t": round(now, 3),
                "processed": round(processed, 3),
                "failed": round(failed, 3),
            }
            self.history.append(point)
            self._sampled = now
            return point, self._workers


def overview(
    broker: Broker, throughput: Throughput, declared: Iterable[str] = ()
) -> dict[str, Any]:
    """Everything the overview page shows."""
    point, workers = throughput.sample()
    stats = queue_stats(broker, declared)
    return {
        "broker": broker.url,
        "time": time.time(),
        "totals": sum_counts(broker.totals()),
        "throughput": point,
        "workers_alive": len(workers),
        "queues": queue_rows(stats),
    }


def tasks(broker: Broker) -> list[dict[str, Any]]:
    """The cluster's counters per queue and task."""
    return count_rows(merge(broker.totals()))
