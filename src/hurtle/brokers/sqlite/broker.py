"""``SQLiteBroker``: publishing, schedules, limits and the admin side; its dead letters are
``deadletters.py``'s."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Unpack

from ...ids import new_id
from ...message import Message, check_messages, encode_many
from ..base import Broker, BrokerOptions, Consumer
from ..common import (
    check_cancel_ttl,
    check_queue_name,
    gcra,
    lock_end,
    unique_key_of,
)
from ..records import QueueStats, StoredResult
from ..reports import TaskCounts, WorkerReport, decode_report
from ..ticks import RECENT_TICKS, TAKEN, WON, TickBatch, TickClaim, claimable, too_early
from . import flows
from .connection import _path_of, _synchronous_of
from .consumer import _SQLiteConsumer
from .deadletters import _DeadLetters
from .recovery import _Recovery
from .schema import (
    _ADD_CURSOR,
    _ADD_QUEUE,
    _ADD_TICK,
    _CLAIM_TICK,
    _FORGET_TICKS,
    _GET_RESULT,
    _HAS_SCHEDULES,
    _IDS,
    _INSERT,
    _INSERT_DELAYED,
    _LAST_TICK,
    _RECENT_TICKS,
    _SCHEDULE_TICKS,
    _SCHEDULES,
    _eta_of,
    _insert_run,
    _next_ids,
    _priority_of,
    _queue_of,
    _report_tables,
)

#: Seconds a broker object trusts that a queue it published to still has its name row: then
#: it writes the row again (``INSERT OR IGNORE``), so a queue forgotten by another process
#: (``forget``) is known again within that long of its next message.
KNOWN_REFRESH = 60.0
#: A row if the queue holds anything (ready, held, delayed, dead, quarantined) or is paused.
_HOLDS_ANY = (
    "SELECT 1 FROM paused WHERE queue = ?1 UNION ALL SELECT 1 FROM messages WHERE queue = ?1 "
    "UNION ALL SELECT 1 FROM delayed WHERE queue = ?1 UNION ALL SELECT 1 FROM dead WHERE "
    "queue = ?1 UNION ALL SELECT 1 FROM quarantine WHERE queue = ?1 LIMIT 1"
)


class SQLiteBroker(_Recovery, _DeadLetters, Broker):
    """The contract on one SQLite file, shared by every process and thread that opens it."""

    def __init__(
        self,
        url: str = "sqlite:///hurtle.db",
        *,
        create: bool = True,
        **options: Unpack[BrokerOptions],
    ) -> None:
        super().__init__(**options)
        self.url = url
        self.path = _path_of(url)
        self.synchronous = _synchronous_of(url)
        self.create = create
        self._lock = threading.Lock()
        self._wake = threading.Condition(threading.Lock())
        self._ticket = 0  # bumped (under _wake) by every local commit that may make work ready
        # (queue, priority) pairs this object knows have a cursor (and their queue a name row),
        # forgotten every KNOWN_REFRESH seconds: another process may have forgotten a queue
        self._known: set[tuple[str, int]] = set()
        self._known_since = time.monotonic()
        self._closed = False
        self._pid = os.getpid()
        self._conn = self._open()

    def _register(
        self, conn: sqlite3.Connection, pairs: set[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """Make sure these (queue, priority) pairs have a cursor; returns those this object did
        not know of, to add to ``_known`` once the transaction committed."""
        if time.monotonic() - self._known_since > KNOWN_REFRESH:
            self._known.clear()
            self._known_since = time.monotonic()
        new = pairs - self._known
        if new:
            conn.executemany(_ADD_QUEUE, [(q,) for q in {q for q, _ in new}])
            conn.executemany(_ADD_CURSOR, sorted(new))
        return new

    def _store(
        self, conn: sqlite3.Connection, items: Sequence[tuple[str, int, float, bytes]], now: float
    ) -> set[tuple[str, int]]:
        """Insert ``(queue, priority, eta, raw)`` items: due ones ready, the others delayed."""
        new = self._register(conn, {(q, p) for q, p, _, _ in items})
        ready = [(q, p, raw) for q, p, eta, raw in items if eta <= now]
        if ready:
            start = _next_ids(conn, len(ready))
            conn.executemany(
                _INSERT, [(q, p, start + i, raw) for i, (q, p, raw) in enumerate(ready)]
            )
        if len(ready) < len(items):
            conn.executemany(
                _INSERT_DELAYED, [(q, eta, p, raw) for q, p, eta, raw in items if eta > now]
            )
        return new

    # -- producer side ---------------------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        if not messages:
            return
        payloads = encode_many(list(messages), self.max_message_size)
        now = time.time()
        if max(map(_eta_of, messages)) <= now:
            # the common case: every message ready
            queues = set(map(_queue_of, messages))
            priorities = set(map(_priority_of, messages))
            if len(queues) == 1 and len(priorities) == 1:  # a send_many: one run of ids
                queue, priority = queues.pop(), priorities.pop()
                with self._write() as conn:
                    new = self._register(conn, {(queue, priority)})
                    _insert_run(conn, queue, priority, _next_ids(conn, len(payloads)), payloads)
                self._known.update(new)
                self._notify()
                return
            pairs = {(m.queue, m.priority) for m in messages}
            with self._write() as conn:
                new = self._register(conn, pairs)
                start = _next_ids(conn, len(messages))
                conn.executemany(
                    _INSERT,
                    [
                        (m.queue, m.priority, i, raw)
                        for m, i, raw in zip(
                            messages, range(start, start + len(messages)), payloads, strict=True
                        )
                    ],
                )
        else:
            items = [
                (m.queue, m.priority, m.eta, raw) for m, raw in zip(messages, payloads, strict=True)
            ]
            with self._write() as conn:
                new = self._store(conn, items, now)
        self._known.update(new)
        self._notify()

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        check_messages(messages)
        keys = [unique_key_of(m) for m in messages]
        payloads = encode_many(list(messages), self.max_message_size)
        with self._write() as conn:
            now = time.time()
            items, out = _take_locks(conn, messages, keys, payloads, now, unique_for)
            new = self._store(conn, items, now) if items else set()
        self._known.update(new)
        if items:
            self._notify()
        return out

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        out = []
        with self._write() as conn:
            now = time.time()
            for key, limit, period, wanted in requests:
                row = conn.execute("SELECT tat FROM rates WHERE key = ?", (key,)).fetchone()
                granted, wait, tat = gcra(row[0] if row else 0.0, now, limit, period, wanted)
                conn.execute("INSERT OR REPLACE INTO rates (key, tat) VALUES (?, ?)", (key, tat))
                out.append((granted, wait))
        return out

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        if not payloads:
            return
        items = [(queue, 0, 0.0, bytes(raw)) for raw in payloads]
        with self._write() as conn:
            new = self._store(conn, items, time.time())
        self._known.update(new)
        self._notify()

    def _store_tick(self, batch: TickBatch) -> TickClaim:
        queue, name, tick, messages = batch.queue, batch.name, batch.tick, batch.messages
        payloads, keys = batch.payloads, batch.keys
        with self._write() as conn:
            now = time.time()  # the write lock is held: every claimer's clock is read in turn
            conn.execute(_SCHEDULES)
            conn.execute(_SCHEDULE_TICKS)
            row = conn.execute(_LAST_TICK, (queue, name)).fetchone()
            recent = [r[0] for r in conn.execute(_RECENT_TICKS, (queue, name))]
            if not claimable(tick, recent, None if row is None else row[0]):
                return TAKEN
            early = too_early(tick, now)
            if early is not None:
                return early
            conn.execute(_CLAIM_TICK, (queue, name, float(tick)))
            conn.execute(_ADD_TICK, (queue, name, float(tick)))
            if len(recent) >= RECENT_TICKS:
                conn.execute(_FORGET_TICKS, (queue, name, RECENT_TICKS - 1))
            if keys is None:
                items = [
                    (m.queue, m.priority, m.eta, raw)
                    for m, raw in zip(messages, payloads, strict=True)
                ]
                holders = [m.id for m in messages]
            else:
                assert batch.unique_for is not None
                items, holders = _take_locks(conn, messages, keys, payloads, now, batch.unique_for)
            new = self._store(conn, items, now) if items else set()
        self._known.update(new)
        if items:
            self._notify()
        held_by = next((h for h, m in zip(holders, messages, strict=True) if h != m.id), None)
        return WON if held_by is None else TickClaim(True, held_by=held_by)

    def last_tick(self, queue: str, name: str) -> float | None:
        with self._read() as conn:
            if conn.execute(_HAS_SCHEDULES).fetchone() is None:
                return None
            row = conn.execute(_LAST_TICK, (queue, name)).fetchone()
        return None if row is None else float(row[0])

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> Consumer:
        return _SQLiteConsumer(self, tuple(queues), worker_id or f"sqlite-{os.getpid()}-{new_id()}")

    # -- admin side ------------------------------------------------------------------------

    def queues(self) -> list[str]:
        with self._read() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM queues ORDER BY name")]

    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        now = time.time()
        with self._read() as conn:
            if queues is None:
                names = [r[0] for r in conn.execute("SELECT name FROM queues ORDER BY name")]
            else:
                names = list(queues)
            if not names:
                return {}
            wanted = (json.dumps(names),)
            # ready, delayed, in flight, dead
            counts = {name: [0, 0, 0, 0] for name in names}
            for queue, ready, n in conn.execute(  # above its cursor: ready; at or below: held
                "SELECT c.queue, m.id > c.last, count(*) FROM cursors c JOIN messages m "
                "ON m.queue = c.queue AND m.priority = c.priority "
                f"WHERE c.queue IN ({_IDS}) GROUP BY 1, 2",
                wanted,
            ):
                counts[queue][0 if ready else 2] += n
            for queue, due, n in conn.execute(  # delayed rows already due are ready
                f"SELECT queue, eta <= ?, count(*) FROM delayed WHERE queue IN ({_IDS}) "
                "GROUP BY 1, 2",
                (now, wanted[0]),
            ):
                counts[queue][0 if due else 1] += n
            for queue, n in conn.execute(
                f"SELECT queue, count(*) FROM dead WHERE queue IN ({_IDS}) GROUP BY queue",
                wanted,
            ):
                counts[queue][3] += n
            for queue, n in conn.execute(  # waiting to be let out one at a time: ready
                f"SELECT queue, count(*) FROM quarantine WHERE queue IN ({_IDS}) GROUP BY queue",
                wanted,
            ):
                counts[queue][0] += n
            paused = {
                r[0]
                for r in conn.execute(f"SELECT queue FROM paused WHERE queue IN ({_IDS})", wanted)
            }
        return {
            name: QueueStats(
                ready=c[0], delayed=c[1], in_flight=c[2], dead=c[3], paused=name in paused
            )
            for name, c in counts.items()
        }

    # -- control: cancellations and paused queues ------------------------------------------

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        ttl = check_cancel_ttl(ttl)
        now = time.time()
        with self._write() as conn:
            conn.execute("DELETE FROM cancelled WHERE until <= ?", (now,))
            conn.executemany(
                "INSERT INTO cancelled (id, until) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET until = max(until, excluded.until)",
                [(str(i), now + ttl) for i in ids],
            )

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        with self._read() as conn:
            return {
                r[0]
                for r in conn.execute(
                    f"SELECT id FROM cancelled WHERE id IN ({_IDS}) AND until > ?",
                    (json.dumps(list(ids)), time.time()),
                )
            }

    def uncancel(self, ids: Sequence[str]) -> None:
        if ids:
            with self._write() as conn:
                conn.execute(
                    f"DELETE FROM cancelled WHERE id IN ({_IDS})", (json.dumps(list(ids)),)
                )

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        if not reports:
            return
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "DELETE FROM progress WHERE id IN (SELECT id FROM progress WHERE expires <= ? "
                "LIMIT 100)",
                (now,),
            )
            conn.executemany(
                "INSERT OR REPLACE INTO progress (id, expires, body) VALUES (?, ?, ?)",
                [(r.id, now + r.ttl, r.payload) for r in reports],
            )

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        if not ids:
            return []
        with self._read() as conn:
            found = {
                r[0]: bytes(r[1])
                for r in conn.execute(
                    f"SELECT id, body FROM progress WHERE id IN ({_IDS}) AND expires > ?",
                    (json.dumps(list(ids)), time.time()),
                )
            }
        return [found.get(i) for i in ids]

    def pause(self, queue: str) -> None:
        check_queue_name(queue)
        with self._write() as conn:
            conn.execute(_ADD_QUEUE, (queue,))
            conn.execute("INSERT OR IGNORE INTO paused (queue) VALUES (?)", (queue,))

    def resume(self, queue: str) -> None:
        check_queue_name(queue)
        with self._write() as conn:
            conn.execute("DELETE FROM paused WHERE queue = ?", (queue,))
        self._notify()  # waiters of this process look again; others see the commit

    def forget(self, queue: str) -> bool:
        check_queue_name(queue)
        with self._write() as conn:
            if conn.execute(_HOLDS_ANY, (queue,)).fetchone() is not None:
                return False
            conn.execute("DELETE FROM queues WHERE name = ?", (queue,))
        # its cursors stay (a publisher that still counts them as made writes under them)
        self._known = {pair for pair in self._known if pair[0] != queue}
        return True

    def paused(self) -> set[str]:
        with self._read() as conn:
            return {r[0] for r in conn.execute("SELECT queue FROM paused")}

    def recover(self) -> int:
        with self._write() as conn:
            moved, released, _ = self._recover_in(conn, time.time())
        if moved or released:
            self._notify()
        return moved

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        with self._read() as conn:  # the delayed_due index: (queue, eta)
            rows = conn.execute(
                "SELECT eta, body FROM delayed WHERE queue = ? ORDER BY eta LIMIT ?", (queue, limit)
            ).fetchall()
        return [(float(r[0]), bytes(r[1])) for r in rows]

    def _stored_purge(self, queues: Sequence[str]) -> int:
        """Delete the rows above each cursor of each queue (ready; those at or below are held),
        its delayed rows and its quarantined ones, all in one transaction."""
        n = 0
        with self._write() as conn:
            for queue in queues:
                n += conn.execute(
                    "DELETE FROM messages WHERE queue = ?1 AND id > (SELECT c.last FROM cursors c "
                    "WHERE c.queue = ?1 AND c.priority = messages.priority)",
                    (queue,),
                ).rowcount
                n += conn.execute("DELETE FROM delayed WHERE queue = ?", (queue,)).rowcount
                n += conn.execute("DELETE FROM quarantine WHERE queue = ?", (queue,)).rowcount
        return n

    def workers(self) -> list[WorkerReport]:
        with self._write() as conn:
            _report_tables(conn)
            conn.execute("DELETE FROM worker_reports WHERE deadline < ?", (time.time(),))
            rows = conn.execute(
                "SELECT deadline, record FROM worker_reports ORDER BY worker_id"
            ).fetchall()
        return [r for d, raw in rows if (r := decode_report(raw, d)) is not None]

    def totals(self) -> list[TaskCounts]:
        with self._write() as conn:
            _report_tables(conn)
            rows = conn.execute("SELECT * FROM worker_totals ORDER BY queue, task").fetchall()
        return [TaskCounts(*row) for row in rows]

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        return flows.chord_results(self, id, total)

    def get_result(self, id: str) -> bytes | None:
        with self._read() as conn:
            row = conn.execute(_GET_RESULT, (id, time.time())).fetchone()
        return None if row is None else bytes(row[0])

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._pid == os.getpid():
                    self._conn.close()
        self._notify()


def _take_locks(
    conn: sqlite3.Connection,
    messages: Sequence[Message],
    keys: list[str],
    payloads: list[bytes],
    now: float,
    unique_for: float,
) -> tuple[list[tuple[str, int, float, bytes]], list[str]]:
    """Take the unique lock of each message whose lock is free, in the caller's transaction:
    ``(the rows to store, per message the id holding its lock)``."""
    conn.execute(  # a bounded sweep of expired locks
        "DELETE FROM uniques WHERE (queue, key) IN (SELECT queue, key FROM uniques "
        "WHERE expires <= ? LIMIT 1000)",
        (now,),
    )
    items: list[tuple[str, int, float, bytes]] = []
    out: list[str] = []
    for m, key, raw in zip(messages, keys, payloads, strict=True):
        row = conn.execute(
            "SELECT id FROM uniques WHERE queue = ? AND key = ? AND expires > ?",
            (m.queue, key, now),
        ).fetchone()
        if row is not None:
            out.append(row[0])
            continue
        conn.execute(
            "INSERT OR REPLACE INTO uniques (queue, key, id, expires) VALUES (?, ?, ?, ?)",
            (m.queue, key, m.id, lock_end(m, now, unique_for)),
        )
        items.append((m.queue, m.priority, m.eta, raw))
        out.append(m.id)
    return items, out
