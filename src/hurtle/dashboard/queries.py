"""Read-only views of a broker, as plain JSON-ready dicts: the dashboard, its API, ``/metrics``
and ``hurtle status`` all read through here.

Nothing here imports Starlette, so ``hurtle status`` works without the ``dashboard`` extra.

Throughput is worked out from workers' reports (``brokers/reports.py``): each worker's rate is
the change of its counters between its two latest reports divided by the time between them, and
holds until its next report; the cluster's rate is the sum. A busy worker reports every second
(``worker/heartbeat.py``), an idle one with its beats: so the chart moves every second while work
runs, and drops to zero within a second of its end. Each point also carries the cluster's totals,
so that the overview's counters follow the same stream.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from ..brokers import Broker, DeadLetter, QueueStats
from ..brokers.reports import KINDS, RUNTIME_BUCKETS, TaskCounts, WorkerReport, merge
from ..errors import DecodeError
from ..message import Message
from ..names import FAIR_MARK, queue_name_problem
from ..names import fair_parent as parent_of_key
from ..sealing import Keyring, readable_call, readable_value

if TYPE_CHECKING:
    from ..app import Hurtle
    from .names import IdleQueues

#: Points of throughput history the dashboard keeps (one a second at most).
HISTORY = 300


def queue_names(
    broker: Broker, declared: Iterable[str] = (), listed: Iterable[str] | None = None
) -> list[str]:
    """Every queue the broker has seen (``listed``, else ``broker.queues()``), and those the
    app's tasks name; less names outside the rule (``hurtle.names``) that a version which did
    not check them let in (on Redis Cluster, ``}x`` cannot even be counted), and the sub-queues
    of fair queues' keys (``fair_keys``)."""
    names = set(declared) | set(broker.queues() if listed is None else listed)
    return sorted(n for n in names if queue_name_problem(n) is None)


def fair_keys(listed: Iterable[str]) -> list[str]:
    """The sub-queues of fair queues' keys (``hurtle.fair``) among the queues ``listed``."""
    return [n for n in listed if FAIR_MARK in n and parent_of_key(n) is not None]


def fair_parent(name: str) -> str:
    """The queue that ``name`` is a key's sub-queue of, or ``name`` itself."""
    return parent_of_key(name) or name


def queue_stats(
    broker: Broker, declared: Iterable[str] = (), idle: IdleQueues | None = None
) -> dict[str, QueueStats]:
    """Counts per queue: ready, delayed, in flight, dead; and whether it is paused; a fair
    queue's counts include its keys' sub-queues (read in the same call). With ``idle``, less
    the queues it forgets now (``names.py``)."""
    listed = broker.queues()
    names = queue_names(broker, declared, listed)
    keys = fair_keys(listed)
    stats = broker.stats(names + keys)
    if keys:
        stats = _folded(stats)
    return stats if idle is None else idle.sweep(stats)


def stats_of(
    broker: Broker, queues: Iterable[str], listed: Iterable[str] | None = None
) -> dict[str, QueueStats]:
    """``broker.stats(queues)``, each queue's counts including its fair keys' sub-queues
    among the queues ``listed`` (else ``broker.queues()``), read in the same call."""
    wanted = list(queues)
    keys = [
        n
        for n in fair_keys(broker.queues() if listed is None else listed)
        if fair_parent(n) in wanted
    ]
    stats = broker.stats(wanted + keys)
    return _folded(stats) if keys else stats


def _folded(stats: dict[str, QueueStats]) -> dict[str, QueueStats]:
    """``stats`` with each fair key's sub-queue's counts added to its queue's, sorted."""
    folded: dict[str, QueueStats] = {}
    for name, s in stats.items():
        queue = fair_parent(name)
        if (was := folded.get(queue)) is not None:
            s = QueueStats(
                ready=was.ready + s.ready,
                delayed=was.delayed + s.delayed,
                in_flight=was.in_flight + s.in_flight,
                dead=was.dead + s.dead,
                paused=was.paused if queue != name else s.paused,
            )
        folded[queue] = s
    return dict(sorted(folded.items()))


def queue_rows(stats: dict[str, QueueStats]) -> list[dict[str, Any]]:
    return [{"name": name, **queue_counts(s)} for name, s in stats.items()]


def queue_counts(stats: QueueStats) -> dict[str, Any]:
    """One queue's counts and whether it is paused, as the API and ``hurtle status --json``
    show them."""
    return {
        "ready": stats.ready,
        "delayed": stats.delayed,
        "in_flight": stats.in_flight,
        "dead": stats.dead,
        "paused": stats.paused,
    }


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
        "running": report.running,
        **{kind: report.total(kind) for kind in KINDS},
    }


def runtime_histograms(reports: Iterable[WorkerReport]) -> list[dict[str, Any]]:
    """Run-time histograms per (queue, task), summed over the workers' reports:
    ``{"queue", "task", "counts", "sum"}``, ``counts`` per bucket of ``RUNTIME_BUCKETS`` and a
    last one beyond them (not cumulative). A report whose buckets differ (a worker of another
    version) is left out rather than mixed in."""
    width = len(RUNTIME_BUCKETS) + 1
    sums: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for report in reports:
        for r in report.runtimes:
            if len(r.counts) != width:
                continue
            counts, total = sums.setdefault((r.queue, r.task), ([0] * width, [0.0]))
            for i, n in enumerate(r.counts):
                counts[i] += n
            total[0] += r.total
    return [
        {"queue": q, "task": t, "counts": counts, "sum": total[0]}
        for (q, t), (counts, total) in sorted(sums.items())
    ]


def count_rows(counts: Iterable[TaskCounts]) -> list[dict[str, Any]]:
    return [msgspec.structs.asdict(c) for c in counts]


def sum_counts(counts: Iterable[TaskCounts]) -> dict[str, int]:
    rows = list(counts)
    return {kind: sum(getattr(c, kind) for c in rows) for kind in KINDS}


def dead_letter_row(dead: DeadLetter, keyring: Keyring | None = None) -> dict[str, Any]:
    """A dead letter for people: its reason's first line, the rest (a traceback) apart, and
    what the message was, if its bytes are one. ``arguments`` is the call's arguments as JSON
    text (``[args]``, then ``{kwargs}`` if any), for the page to show as text; bytes that are
    no message (decoded as MessagePack into plain data only: nothing is ever unpickled) have
    ``undecodable`` saying why instead."""
    summary, _, trace = dead.reason.partition("\n")
    row: dict[str, Any] = {
        "id": dead.id,
        "queue": dead.queue,
        "reason": summary,
        "traceback": trace,
        "failed_at": dead.failed_at,
        "message_id": None,
        "task": None,
        "attempt": None,
        "args": None,
        "kwargs": None,
        "arguments": None,
        "undecodable": None,
        "size": len(dead.raw),
    }
    try:
        message = Message.decode(dead.raw)
    except DecodeError as err:
        row["undecodable"] = str(err)
        return row
    shown, keywords = readable_call(message.task, message.args, message.kwargs, keyring)
    args, kwargs = _json_safe(shown), _json_safe(keywords)
    text = _json_text(args) + (f" {_json_text(kwargs)}" if keywords else "")
    row.update(
        message_id=message.id,
        task=message.task,
        attempt=message.attempt + 1,
        args=args,
        kwargs=kwargs,
        arguments=text,
    )
    return row


def _json_text(value: Any) -> str:
    """JSON text with a space after each separator, as people write it."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


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
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
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

    def sample(self) -> tuple[dict[str, Any], list[WorkerReport]]:
        """The newest point ``{"t", "processed", "failed", "totals"}`` (rates per second, and
        the cluster's counters) and the live workers' reports."""
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
                "totals": sum_counts(self.broker.totals()),
            }
            self.history.append(point)
            self._sampled = now
            return point, self._workers


def overview(
    broker: Broker,
    throughput: Throughput,
    declared: Iterable[str] = (),
    idle: IdleQueues | None = None,
) -> dict[str, Any]:
    """Everything the overview page shows."""
    point, workers = throughput.sample()
    stats = queue_stats(broker, declared, idle)
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


def task_lookup(
    broker: Broker,
    message_id: str,
    keeps_results: Any = None,
    keyring: Keyring | None = None,
) -> dict[str, Any]:
    """What is known of the message ``message_id``: its stored record (tasks that keep results,
    ``hurtle.middleware.results``), else its dead letter, else nothing — then ``state`` is
    ``unknown`` and ``note`` says why that may be.

    Two reads by id, whatever the number of queues: the record, and the dead letter through the
    broker's index (``Broker.find_dead``). ``keeps_results`` maps task names to whether they
    keep results (the app's tasks), to say so.
    """
    from ..progress import decode_progress
    from ..records import decode as decode_record

    known = dict(keeps_results or {})
    row: dict[str, Any] = {
        "id": message_id,
        "state": "unknown",
        "source": None,
        "task": None,
        "queue": None,
        "attempt": None,
        "args": None,
        "kwargs": None,
        "result": None,
        "error": None,
        "enqueued_at": None,
        "started_at": None,
        "finished_at": None,
        "keeps_result": None,
        "dead_letter_id": None,
        "progress": None,
        "note": "",
    }
    report = decode_progress(broker.get_progress([message_id])[0])
    if report is not None:  # the task's latest ``hurtle.current().progress`` report
        row["progress"] = {
            "fraction": report.fraction,
            "message": report.message,
            "at": report.at,
        }
    payload = broker.get_result(message_id)
    if payload is not None:
        try:
            record = decode_record(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            record = None
        if record is not None:
            row.update(state=record.state, source="result", keeps_result=True)
            if record.task:
                row.update(task=record.task, queue=record.queue, attempt=record.attempt + 1)
            if record.args_kept:
                args, kwargs = readable_call(record.task, record.args, record.kwargs, keyring)
                row.update(args=_json_safe(args), kwargs=_json_safe(kwargs))
            if record.state == "succeeded":
                row["result"] = _json_safe(readable_value(record.task, record.value, keyring))
            else:
                row["error"] = {
                    "type": record.error_type,
                    "message": record.error_message,
                    "traceback": record.traceback,
                }
            for field, value in (
                ("enqueued_at", record.enqueued),
                ("started_at", record.started),
                ("finished_at", record.finished),
            ):
                row[field] = value or None
            if record.task and not record.args_kept:
                row["note"] = "the arguments were too large to keep with the result"
            elif not record.task:
                row["note"] = "a record of an older version: no arguments or timings"
            if record.state == "failed":
                row["note"] = "an attempt failed and another is scheduled"
    final = row["state"] in ("succeeded", "failed")
    dead = None if final else broker.find_dead(message_id)
    if dead is not None:
        summary, _, trace = dead.reason.partition("\n")
        message = dead.message()
        if row["source"] is None:
            error = {"type": "", "message": summary, "traceback": trace}
            state = dead.reason if dead.reason in ("expired", "cancelled") else "dead"
            row.update(state=state, source="dead_letter", error=error, finished_at=dead.failed_at)
        row["queue"] = dead.queue
        if message is not None:
            args, kwargs = readable_call(message.task, message.args, message.kwargs, keyring)
            row.update(
                task=message.task,
                attempt=message.attempt + 1,
                args=_json_safe(args),
                kwargs=_json_safe(kwargs),
                enqueued_at=message.created or None,
            )
        row["dead_letter_id"] = dead.id
    if row["task"] is not None and row["keeps_result"] is None:
        row["keeps_result"] = known.get(row["task"])
    if row["source"] == "dead_letter" and row["keeps_result"] is False:
        row["note"] = (
            f"task {row['task']} keeps no result: what is shown comes from its dead letter"
        )
    if row["source"] is None and row["progress"] is not None:
        row["note"] = (
            "no outcome is recorded yet: the task reported its progress (below); the page "
            "follows it until an outcome is recorded"
        )
    elif row["source"] is None:
        keeping = sorted(name for name, keeps in known.items() if keeps)
        row["note"] = (
            "nothing is recorded under this id: the message may wait in its queue or run now "
            "(records are written at the outcome), its task may keep no result "
            "(store_result=False), or its record expired (result_ttl). "
            + (
                f"Tasks that keep results: {', '.join(keeping)}."
                if keeping
                else "No task of this app keeps results."
            )
        )
    return row


#: Delayed messages per queue whose ETAs the scheduled page lists, where the broker can.
NEXT_DELAYED = 5


def schedule_rows(app: Hurtle, now: float | None = None) -> list[dict[str, Any]]:
    """Each periodic task of ``app``: what it sends, when, its last run (the last tick claimed,
    from the broker, whichever worker claimed it) and its next (computed here)."""
    now = time.time() if now is None else now
    rows: list[dict[str, Any]] = []
    for name in sorted(app.schedules):
        s = app.schedules[name]
        rows.append(
            {
                "name": name,
                "task": s.task.name,
                "queue": s.queue,
                "cron": s.cron,
                "every": s.every,
                "tz": str(s.tz),
                "when": s.describe(),
                "catch_up": s.catch_up,
                "last_run": app.broker.last_tick(s.queue, name),
                "next_run": s.next_after(now),
            }
        )
    return rows


def delayed_rows(broker: Broker, declared: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Delayed messages per queue: how many, and the next ``NEXT_DELAYED`` (ETA, id, task) where
    the broker can list them cheaply (``Broker.next_delayed``); ``listed`` says whether it did."""
    rows = []
    for name, s in queue_stats(broker, declared).items():
        upcoming = broker.next_delayed(name, NEXT_DELAYED) if s.delayed else []
        next_rows = None
        if upcoming is not None:
            next_rows = []
            for eta, raw in upcoming:
                try:
                    m = Message.decode(raw)
                    next_rows.append({"eta": eta, "id": m.id, "task": m.task})
                except DecodeError:
                    next_rows.append({"eta": eta, "id": None, "task": None})
        rows.append(
            {
                "queue": name,
                "delayed": s.delayed,
                "listed": next_rows is not None,
                "next": next_rows or [],
            }
        )
    return rows
