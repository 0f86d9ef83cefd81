"""``_SQLiteConsumer``: one worker's session — fetch (sleep-polling), settling, slots, heartbeat."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

from ...errors import BrokerError
from ...message import Message
from ..common import log_trimmed
from ..consumer import BatchConsumer, beat_through
from ..records import Delivery, FlowStep, Lock, StoredResult
from ..reports import WorkerReport, encode_report
from . import flows
from .schema import (
    _ADD_CLAIM,
    _ADD_TOTALS,
    _CANCELS_LIVE,
    _CURSORS,
    _CURSORS_PROBES,
    _DROP_EMPTY,
    _DROP_REACHED,
    _EXPIRE_RESULTS,
    _INSERT,
    _INSERT_DEAD,
    _MOVE_CURSOR,
    _PRIORITY_BITS,
    _PRIORITY_MASK,
    _PUT_RESULT,
    _SETTLE,
    _SETTLE_MANY,
    _SETTLE_MANY_HELD,
    _SETTLE_RANGE,
    _SETTLE_RANGE_HELD,
    _TAKE,
    _TAKE_BACK,
    _TAKE_BACK_RANGE,
    _UPSERT_REPORT,
    _UPSERT_WORKER,
    Rows,
    _clamp,
    _dead_row,
    _group,
    _next_ids,
    _placeholders,
    _report_tables,
    _requeue,
    _settle_range,
)

if TYPE_CHECKING:
    from .broker import SQLiteBroker

_POLL_FIRST = 0.001
_POLL_MAX = 0.025


class _SQLiteConsumer(BatchConsumer):
    combines_ack_and_fetch = True

    def __init__(self, broker: SQLiteBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        #: This worker's own timeout: its deadline, as other workers see it, is a beat plus this.
        self.heartbeat_timeout = broker.heartbeat_timeout
        marks = _placeholders(len(queues))
        # paused queues (the ``paused`` table) are neither promoted, taken nor waited for
        self._promote_sql = (
            f"DELETE FROM delayed WHERE queue IN ({marks}) AND eta <= ? "
            "AND queue NOT IN (SELECT queue FROM paused) "
            "RETURNING seq, queue, priority, body"
        )
        self._paused_sql = f"SELECT queue FROM paused WHERE queue IN ({marks})"
        # one queue holds one probe ready at most: only a fetch over several looks for them
        self._cursors_sql = _CURSORS_PROBES if len(queues) > 1 else _CURSORS
        self._probe_sql = "SELECT " + ", ".join(
            [
                f"EXISTS (SELECT 1 FROM cursors c WHERE c.queue IN ({marks}) "
                "AND c.queue NOT IN (SELECT queue FROM paused) AND EXISTS ("
                "SELECT 1 FROM messages m WHERE m.queue = c.queue AND m.priority = c.priority "
                "AND m.id > c.last))"
            ]
            + [
                "(SELECT min(eta) FROM delayed WHERE queue = ? "
                "AND queue NOT IN (SELECT queue FROM paused))"
            ]
            * len(queues)
        )
        with broker._write() as conn:
            conn.execute(_UPSERT_WORKER, (worker_id, time.time() + self.heartbeat_timeout))

    # -- fetching --------------------------------------------------------------------------

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        if not self.queues or max_count <= 0:
            if timeout > 0:
                time.sleep(timeout)
            return []
        b = self.broker
        deadline = time.monotonic() + timeout
        while True:
            ticket = b._ticket
            out = self._claim(max_count)
            if out or not self._wait(deadline, ticket):
                return out

    def ack_and_fetch(
        self, deliveries: Sequence[Delivery], max_count: int, timeout: float
    ) -> list[Delivery]:
        """One transaction deletes the acknowledged rows and claims the next batch."""
        if not deliveries or not self.queues or max_count <= 0:
            return super().ack_and_fetch(deliveries, max_count, timeout)
        out = self._claim(max_count, settle=_group(deliveries))
        return out or self.fetch(max_count, timeout)

    def _claim(
        self, max_count: int, settle: dict[tuple[str, int], list[int]] | None = None
    ) -> list[Delivery]:
        worker_id = self.worker_id
        out: list[Delivery] = []
        with self.broker._write() as conn:
            now = time.time()
            if settle:
                self._ack_in(conn, settle)
            # Re-register if declared dead meanwhile, so that what it takes stays recoverable.
            conn.execute(
                "INSERT OR IGNORE INTO workers (worker_id, deadline) VALUES (?, ?)",
                (worker_id, now + self.heartbeat_timeout),
            )
            due = conn.execute(self._promote_sql, (*self.queues, now)).fetchall()
            if due:  # to the back of their priority, in the order they were published
                due.sort(key=itemgetter(0))
                start = _next_ids(conn, len(due))
                conn.executemany(
                    _INSERT, [(q, p, start + i, body) for i, (_, q, p, body) in enumerate(due)]
                )
            paused = {r[0] for r in conn.execute(self._paused_sql, self.queues)}
            for queue in self.queues:
                if queue in paused:
                    continue
                probed = False
                for priority, last, probe in conn.execute(self._cursors_sql, (queue,)).fetchall():
                    rows = conn.execute(
                        _TAKE, (queue, priority, last, max_count - len(out))
                    ).fetchall()
                    if not rows:
                        continue
                    hi = rows[-1][0]
                    probed = probed or (probe is not None and probe <= hi)
                    conn.execute(_MOVE_CURSOR, (hi, queue, priority))
                    conn.execute(_ADD_CLAIM, (worker_id, queue, priority, rows[0][0], hi))
                    out += [
                        Delivery(queue, body, id_ << _PRIORITY_BITS | priority)
                        for id_, body in rows
                    ]
                    if len(out) >= max_count:
                        break
                if len(out) >= max_count or probed:
                    break  # full, or it holds a message let out of quarantine: alone of those
            if out:  # read in the same transaction: no extra step for the worker's screen
                self.cancellations = conn.execute(_CANCELS_LIVE, (now,)).fetchone() is not None
        return out

    def _wait(self, deadline: float, ticket: int) -> bool:
        """Sleep until something may be ready (True) or the deadline passes (False)."""
        b = self.broker
        delay = _POLL_FIRST
        version: int | None = None
        next_eta: float | None = None
        while True:
            if b._ticket != ticket:
                return True
            b._after_fork_check()
            with b._lock:
                if b._closed:
                    return False
                conn = b._connection()
                try:
                    current = conn.execute("PRAGMA data_version").fetchone()[0]
                    if current != version:  # another connection committed: look again
                        version = current
                        ready, *etas = conn.execute(
                            self._probe_sql, (*self.queues, *self.queues)
                        ).fetchone()
                        if ready:
                            return True
                        due = [e for e in etas if e is not None]
                        next_eta = min(due) if due else None
                except sqlite3.Error as err:
                    raise BrokerError(f"SQLite broker {b.url!r}: {err}") from err
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait = min(left, delay)
            if next_eta is not None:
                until = next_eta - time.time()
                if until <= 0:
                    return True
                wait = min(wait, until)
            with b._wake:
                if b._ticket == ticket:
                    b._wake.wait(wait)
            delay = min(delay * 2, _POLL_MAX)

    # -- settling --------------------------------------------------------------------------
    # A delivery no longer held (its worker was declared dead and it went back to its queue)
    # is left to whoever holds it now: it went back under a new id, so settling the old
    # receipt finds no row and does nothing.

    def _ack_in(self, conn: sqlite3.Connection, groups: dict[tuple[str, int], list[int]]) -> None:
        for (queue, priority), ids in groups.items():
            span = _settle_range(ids)
            if span is None:
                conn.execute(_SETTLE_MANY, (queue, priority, json.dumps(ids)))
            else:
                conn.execute(_SETTLE_RANGE, (queue, priority, *span))
            conn.execute(_DROP_REACHED, (self.worker_id, queue, priority, max(ids)))

    def _ack_held(
        self, conn: sqlite3.Connection, groups: dict[tuple[str, int], list[int]]
    ) -> set[tuple[str, int]] | None:
        """``_ack_in``, telling which deliveries were still held: None when all of them were,
        else the ``(queue, receipt)`` of those that were."""
        held: list[tuple[str, int, list[tuple[int]]]] = []
        missing = False
        for (queue, priority), ids in groups.items():
            span = _settle_range(ids)
            if span is None:
                settled = conn.execute(_SETTLE_MANY_HELD, (queue, priority, json.dumps(ids)))
            else:
                settled = conn.execute(_SETTLE_RANGE_HELD, (queue, priority, *span))
            rows = settled.fetchall()
            conn.execute(_DROP_REACHED, (self.worker_id, queue, priority, max(ids)))
            missing = missing or len(rows) < len(set(ids))
            held.append((queue, priority, rows))
        if not missing:
            return None
        return {
            (queue, id_ << _PRIORITY_BITS | priority)
            for queue, priority, rows in held
            for (id_,) in rows
        }

    def _settle_one(self, conn: sqlite3.Connection, delivery: Delivery) -> bool:
        """Delete one held row; False when it is not held any more."""
        receipt = delivery.receipt
        priority, id_ = receipt & _PRIORITY_MASK, receipt >> _PRIORITY_BITS
        if not conn.execute(_SETTLE, (delivery.queue, priority, id_)).rowcount:
            return False
        conn.execute(_DROP_REACHED, (self.worker_id, delivery.queue, priority, id_))
        return True

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        if not deliveries and not results:
            return
        groups = _group(deliveries)
        with self.broker._write() as conn:
            if not results:
                self._ack_in(conn, groups)
                return
            # one transaction: the acknowledgements say which deliveries were still held, and
            # only their records are stored (a worker taken for dead meanwhile leaves the
            # record to the copy delivered again)
            held = self._ack_held(conn, groups)
            if held is not None:
                n = len(deliveries)
                results = [
                    r
                    for i, r in enumerate(results)
                    if i >= n or (deliveries[i].queue, deliveries[i].receipt) in held
                ]
            now = time.time()
            conn.execute(_EXPIRE_RESULTS, (now,))
            conn.executemany(_PUT_RESULT, [(r.id, now + r.ttl, r.payload) for r in results])

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        flows.ack_flow(self, steps)

    def retry(self, delivery: Delivery, message: Message) -> None:
        raw = message.encode()
        b = self.broker
        new: set[tuple[str, int]] = set()
        with b._write() as conn:
            if self._settle_one(conn, delivery):
                item = (message.queue, _clamp(message.priority), message.eta, raw)
                new = b._store(conn, [item], time.time())
        b._known.update(new)
        b._notify()

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        b = self.broker
        expired = dropped = 0
        with b._write() as conn:
            if self._settle_one(conn, delivery):
                now = time.time()
                conn.execute(_INSERT_DEAD, _dead_row(delivery.queue, reason, delivery.raw, now))
                expired, dropped = b._trim_dead(conn, delivery.queue, now)
        log_trimmed(b, delivery.queue, expired, dropped)

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        """Every dead letter in one transaction."""
        if not items:
            return
        b = self.broker
        trimmed: dict[str, tuple[int, int]] = {}
        with b._write() as conn:
            now = time.time()
            queues = set()
            for delivery, reason in items:
                if self._settle_one(conn, delivery):
                    conn.execute(_INSERT_DEAD, _dead_row(delivery.queue, reason, delivery.raw, now))
                    queues.add(delivery.queue)
            for queue in queues:
                trimmed[queue] = b._trim_dead(conn, queue, now)
        for queue, (expired, dropped) in trimmed.items():
            log_trimmed(b, queue, expired, dropped)

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        b = self.broker
        new: set[tuple[str, int]] = set()
        with b._write() as conn:
            kept = [
                (d.queue, d.receipt & _PRIORITY_MASK, eta, d.raw)
                for d, eta in items
                if self._settle_one(conn, d)
            ]
            if kept:
                new = b._store(conn, kept, time.time())
        b._known.update(new)
        b._notify()

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        out = []
        with self.broker._write() as conn:
            now = time.time()
            conn.execute(  # known again if declared dead meanwhile
                "INSERT OR IGNORE INTO workers (worker_id, deadline) VALUES (?, ?)",
                (self.worker_id, now + self.heartbeat_timeout),
            )
            for key, limit, wanted in requests:
                conn.execute(
                    "DELETE FROM slots WHERE key = ? AND worker NOT IN "
                    "(SELECT worker_id FROM workers WHERE deadline >= ?)",
                    (key, now),
                )
                held = conn.execute(
                    "SELECT coalesce(sum(n), 0) FROM slots WHERE key = ?", (key,)
                ).fetchone()[0]
                granted = max(0, min(wanted, limit - held))
                if granted:
                    conn.execute(
                        "INSERT INTO slots (key, worker, n) VALUES (?, ?, ?) "
                        "ON CONFLICT (key, worker) DO UPDATE SET n = n + excluded.n",
                        (key, self.worker_id, granted),
                    )
                out.append(granted)
        return out

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        with self.broker._write() as conn:
            for key, count in releases:
                conn.execute(
                    "UPDATE slots SET n = n - ? WHERE key = ? AND worker = ?",
                    (count, key, self.worker_id),
                )
            conn.execute("DELETE FROM slots WHERE worker = ? AND n <= 0", (self.worker_id,))

    def release_unique(self, locks: Sequence[Lock]) -> None:
        with self.broker._write() as conn:
            conn.executemany(
                "DELETE FROM uniques WHERE queue = ? AND key = ? AND id = ?",
                [lock[:3] for lock in locks],
            )

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give them back, under new ids: at the back of their priority (see the package doc)."""
        if not deliveries:
            return
        groups = _group(deliveries)
        with self.broker._write() as conn:
            rows: Rows = []
            for (queue, priority), ids in groups.items():
                rows += conn.execute(_TAKE_BACK, (queue, priority, json.dumps(ids))).fetchall()
            _requeue(conn, rows)
            conn.execute(_DROP_EMPTY, (self.worker_id,))
        self.broker._notify()

    def heartbeat(self) -> bool:
        b = self.broker
        with self._reporting() as report, b._write() as conn:
            now = time.time()
            conn.execute(_UPSERT_WORKER, (self.worker_id, now + self.heartbeat_timeout))
            if report is not None:
                self._store_report(conn, report, now)
            conn.execute(_DROP_EMPTY, (self.worker_id,))
            moved, released, pending = b._recover_in(conn, now)
        if moved or released:
            b._notify()
        return pending

    def send_report(self) -> None:
        with self._reporting() as report:
            if report is not None:
                with self.broker._write() as conn:
                    self._store_report(conn, report, time.time())

    def _store_report(self, conn: sqlite3.Connection, report: WorkerReport, now: float) -> None:
        _report_tables(conn)
        conn.execute("DELETE FROM worker_reports WHERE deadline < ?", (now,))
        conn.execute(
            _UPSERT_REPORT, (self.worker_id, now + self.heartbeat_timeout, encode_report(report))
        )
        conn.executemany(_ADD_TOTALS, _total_rows(report))

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        own = type(self.broker)(  # its own connection, to the same file
            self.broker.url,
            heartbeat_timeout=self.heartbeat_timeout,
            max_recoveries=self.broker.max_recoveries,
        )
        return beat_through(own, self)

    def close(self) -> None:
        b = self.broker
        if b._closed:
            return
        with self._reporting() as report, b._write() as conn:
            if report is not None:  # leaves with its last counts in the totals
                _report_tables(conn)
                conn.execute("DELETE FROM worker_reports WHERE worker_id = ?", (self.worker_id,))
                conn.executemany(_ADD_TOTALS, _total_rows(report))
            rows: Rows = []
            for queue, priority, lo, hi in conn.execute(
                "SELECT queue, priority, lo, hi FROM claims WHERE worker = ?", (self.worker_id,)
            ).fetchall():
                rows += conn.execute(_TAKE_BACK_RANGE, (queue, priority, lo, hi)).fetchall()
            _requeue(conn, rows)
            conn.execute("DELETE FROM claims WHERE worker = ?", (self.worker_id,))
            conn.execute("DELETE FROM workers WHERE worker_id = ?", (self.worker_id,))
            conn.execute("DELETE FROM slots WHERE worker = ?", (self.worker_id,))
        b._notify()


def _total_rows(report: WorkerReport) -> list[tuple[object, ...]]:
    """The parameters of ``_ADD_TOTALS`` for what ``report`` adds to the totals."""
    return [
        (c.queue, c.task, c.processed, c.failed, c.retried, c.dead_lettered) for c in report.delta
    ]
