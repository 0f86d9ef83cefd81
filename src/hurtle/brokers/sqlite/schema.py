"""The file's tables, the upgrades from older versions, the statements the broker runs on them,
and the small helpers over held rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from itertools import repeat
from operator import and_, attrgetter, itemgetter, rshift

from ...ids import new_id
from ...message import MAX_PRIORITY, MIN_PRIORITY, message_id
from ..records import Delivery

_SCHEMA_VERSION = 5
#: A receipt is ``id << _PRIORITY_BITS | priority``, i.e. ``id * 16 + priority``.
_PRIORITY_BITS = 4
_PRIORITY_MASK = (1 << _PRIORITY_BITS) - 1
assert MAX_PRIORITY <= _PRIORITY_MASK and MIN_PRIORITY >= 0
_POISON_SCHEMA = """
CREATE TABLE deaths (
    queue  TEXT    NOT NULL,
    digest TEXT    NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (queue, digest)
) WITHOUT ROWID;
CREATE TABLE quarantine (
    seq      INTEGER PRIMARY KEY,
    queue    TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    body     BLOB    NOT NULL
);
CREATE INDEX quarantine_queue ON quarantine (queue, seq);
CREATE TABLE probes (
    queue    TEXT    NOT NULL,
    digest   TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    id       INTEGER NOT NULL,
    PRIMARY KEY (queue, digest)
) WITHOUT ROWID;
"""

# Rate limits (key -> theoretical arrival time), concurrency slots (held per worker: only those
# of workers whose deadline has not passed count) and unique locks (message id, until expires).
_LIMITS_SCHEMA = """
CREATE TABLE rates (
    key TEXT PRIMARY KEY,
    tat REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE slots (
    key    TEXT    NOT NULL,
    worker TEXT    NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (key, worker)
) WITHOUT ROWID;
CREATE TABLE uniques (
    queue   TEXT NOT NULL,
    key     TEXT NOT NULL,
    id      TEXT NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (queue, key)
) WITHOUT ROWID;
CREATE INDEX uniques_expires ON uniques (expires);
"""

_SCHEMA = (
    """
CREATE TABLE messages (
    queue    TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    id       INTEGER NOT NULL,
    body     BLOB    NOT NULL,
    PRIMARY KEY (queue, priority, id)
) WITHOUT ROWID;
CREATE TABLE cursors (
    queue    TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    last     INTEGER NOT NULL,
    PRIMARY KEY (queue, priority)
) WITHOUT ROWID;
CREATE TABLE claims (
    batch    INTEGER PRIMARY KEY,
    worker   TEXT    NOT NULL,
    queue    TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    lo       INTEGER NOT NULL,
    hi       INTEGER NOT NULL
);
CREATE INDEX claims_worker ON claims (worker);
CREATE TABLE seq (next INTEGER NOT NULL);
INSERT INTO seq (next) VALUES (1);
CREATE TABLE delayed (
    seq      INTEGER PRIMARY KEY,
    queue    TEXT    NOT NULL,
    eta      REAL    NOT NULL,
    priority INTEGER NOT NULL,
    body     BLOB    NOT NULL
);
CREATE INDEX delayed_due ON delayed (queue, eta);
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    deadline  REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE dead (
    seq       INTEGER PRIMARY KEY,
    id        TEXT    NOT NULL UNIQUE,
    queue     TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    body      BLOB    NOT NULL,
    failed_at REAL    NOT NULL,
    message_id TEXT
);
CREATE INDEX dead_queue ON dead (queue);
CREATE INDEX dead_message ON dead (message_id);
CREATE TABLE queues (name TEXT PRIMARY KEY) WITHOUT ROWID;
"""
    + _POISON_SCHEMA
    + _LIMITS_SCHEMA
)

# Schema version -> the statements that turn it into the next one.
_UPGRADES = {
    # version 2 recorded a worker's last beat; version 3 its deadline (the writer's timeout of
    # those days was 20 s unless set otherwise: workers still running get that much)
    2: "ALTER TABLE workers RENAME COLUMN last_seen TO deadline; "
    "UPDATE workers SET deadline = deadline + 20.0;" + _POISON_SCHEMA,
    3: _LIMITS_SCHEMA,
    # version 5 finds a dead letter by its message's id (``hurtle_message_id``: ``_migrate``)
    4: "ALTER TABLE dead ADD COLUMN message_id TEXT; "
    "UPDATE dead SET message_id = NULLIF(hurtle_message_id(body), ''); "
    "CREATE INDEX dead_message ON dead (message_id)",
}

_RESULTS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, expires REAL NOT NULL, "
    "body BLOB NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS results_expires ON results (expires)",
)
#: Paused queues and cancelled message ids, made when the file is opened (like results).
_CONTROL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS paused (queue TEXT PRIMARY KEY) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS cancelled (id TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS cancelled_until ON cancelled (until)",
    # running tasks' progress reports (``Broker.put_progress``), apart from their results
    "CREATE TABLE IF NOT EXISTS progress (id TEXT PRIMARY KEY, expires REAL NOT NULL, "
    "body BLOB NOT NULL) WITHOUT ROWID",
)
#: Whether some cancellation is still live (a fetch that took something asks, in its step).
_CANCELS_LIVE = "SELECT 1 FROM cancelled WHERE until > ? LIMIT 1"
_PUT_RESULT = "INSERT OR REPLACE INTO results (id, expires, body) VALUES (?, ?, ?)"
_EXPIRE_RESULTS = (
    "DELETE FROM results WHERE id IN (SELECT id FROM results WHERE expires <= ? LIMIT 100)"
)
_GET_RESULT = "SELECT body FROM results WHERE id = ? AND expires > ?"

_IDS = "SELECT value FROM json_each(?)"
_NEXT_IDS = "UPDATE seq SET next = next + ? RETURNING next"
_INSERT = "INSERT INTO messages (queue, priority, id, body) VALUES (?, ?, ?, ?)"
#: Rows of one ``(queue, priority)`` under consecutive ids, inserted ``size`` per statement: one
#: multi-row ``VALUES`` binds the queue, the priority and the first id once, then each body. It
#: costs about half of an ``executemany`` of single rows, whose per-row binding dominates; each
#: statement is compiled once per connection (more rows per statement compile slower and gain
#: nothing). What is left over goes through ``_INSERT``.
_INSERT_RUNS = tuple(
    (
        size,
        "INSERT INTO messages (queue, priority, id, body) VALUES "
        + ", ".join(f"(?1, ?2, ?3 + {i}, ?{i + 4})" for i in range(size)),
    )
    for size in (100, 10)
)
_INSERT_DELAYED = "INSERT INTO delayed (queue, eta, priority, body) VALUES (?, ?, ?, ?)"
_ADD_QUEUE = "INSERT OR IGNORE INTO queues (name) VALUES (?)"
_ADD_CURSOR = "INSERT OR IGNORE INTO cursors (queue, priority, last) VALUES (?, ?, 0)"
_UPSERT_WORKER = (
    "INSERT INTO workers (worker_id, deadline) VALUES (?, ?) "
    "ON CONFLICT (worker_id) DO UPDATE SET deadline = excluded.deadline"
)
_CURSORS = "SELECT priority, last, NULL FROM cursors WHERE queue = ? ORDER BY priority DESC"
#: ``_CURSORS`` with, per priority, the id of a probe (a message let out of quarantine) still
#: ready there: a consumer of several queues reads no further queue once it took one.
_CURSORS_PROBES = (
    "SELECT c.priority, c.last, (SELECT min(p.id) FROM probes p WHERE p.queue = c.queue "
    "AND p.priority = c.priority AND p.id > c.last) FROM cursors c WHERE c.queue = ? "
    "ORDER BY c.priority DESC"
)
_TAKE = (
    "SELECT id, body FROM messages WHERE queue = ? AND priority = ? AND id > ? ORDER BY id LIMIT ?"
)
_MOVE_CURSOR = "UPDATE cursors SET last = ? WHERE queue = ? AND priority = ?"
_ADD_CLAIM = "INSERT INTO claims (worker, queue, priority, lo, hi) VALUES (?, ?, ?, ?, ?)"
_SETTLE = "DELETE FROM messages WHERE queue = ? AND priority = ? AND id = ?"
_SETTLE_MANY = f"DELETE FROM messages WHERE queue = ? AND priority = ? AND id IN ({_IDS})"
_SETTLE_MANY_HELD = f"{_SETTLE_MANY} RETURNING id"
#: ``_SETTLE_MANY`` when the ids are every whole number from one to another (``_settle_range``).
_SETTLE_RANGE = "DELETE FROM messages WHERE queue = ? AND priority = ? AND id BETWEEN ? AND ?"
_SETTLE_RANGE_HELD = f"{_SETTLE_RANGE} RETURNING id"
_TAKE_BACK = (
    f"DELETE FROM messages WHERE queue = ? AND priority = ? AND id IN ({_IDS}) "
    "RETURNING queue, priority, id, body"
)
_TAKE_BACK_RANGE = (
    "DELETE FROM messages WHERE queue = ? AND priority = ? AND id BETWEEN ? AND ? "
    "RETURNING queue, priority, id, body"
)
_CLAIM_IS_EMPTY = (
    "NOT EXISTS (SELECT 1 FROM messages m WHERE m.queue = claims.queue "
    "AND m.priority = claims.priority AND m.id BETWEEN claims.lo AND claims.hi)"
)
# Claims of a worker that an ack reached (their ``lo`` is at most the highest id acked) and
# that hold nothing any more: one index seek per claim of the worker, per batch.
_DROP_REACHED = (
    "DELETE FROM claims WHERE worker = ? AND queue = ? AND priority = ? AND lo <= ? "
    f"AND {_CLAIM_IS_EMPTY}"
)
_DROP_EMPTY = f"DELETE FROM claims WHERE worker = ? AND {_CLAIM_IS_EMPTY}"
#: A dead letter, with its message's id (``message.message_id``, None when the bytes are not a
#: message) for ``find_dead`` to read through the ``dead_message`` index.
_INSERT_DEAD = (
    "INSERT INTO dead (id, queue, reason, body, failed_at, message_id) VALUES (?, ?, ?, ?, ?, ?)"
)
# Dead letters of a queue are trimmed in the order they were recorded (``seq``, which the
# ``dead_queue`` index holds): expiry reads the oldest rows only until the first one still
# within the ttl, so a write that expires nothing reads one row; the cap walks that index.
_EXPIRE_DEAD = (
    "DELETE FROM dead WHERE queue = ?1 AND seq < (SELECT seq FROM dead WHERE queue = ?1 "
    "AND failed_at >= ?2 ORDER BY seq LIMIT 1)"
)
_CAP_DEAD = (
    "DELETE FROM dead WHERE queue = ?1 AND seq <= (SELECT seq FROM dead WHERE queue = ?1 "
    "ORDER BY seq DESC LIMIT 1 OFFSET ?2)"
)
_SCHEDULES = (
    "CREATE TABLE IF NOT EXISTS schedules (queue TEXT NOT NULL, name TEXT NOT NULL, "
    "last REAL NOT NULL, PRIMARY KEY (queue, name)) WITHOUT ROWID"
)
_HAS_SCHEDULES = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schedules'"
# The schedule's last tick: the newer of the one recorded and this one.
_CLAIM_TICK = (
    "INSERT INTO schedules (queue, name, last) VALUES (?, ?, ?) ON CONFLICT (queue, name) "
    "DO UPDATE SET last = max(schedules.last, excluded.last)"
)
# The latest ticks claimed per schedule (``brokers.ticks.RECENT_TICKS`` of them).
_SCHEDULE_TICKS = (
    "CREATE TABLE IF NOT EXISTS schedule_ticks (queue TEXT NOT NULL, name TEXT NOT NULL, "
    "tick REAL NOT NULL, PRIMARY KEY (queue, name, tick)) WITHOUT ROWID"
)
_RECENT_TICKS = "SELECT tick FROM schedule_ticks WHERE queue = ? AND name = ? ORDER BY tick"
_ADD_TICK = "INSERT INTO schedule_ticks (queue, name, tick) VALUES (?, ?, ?)"
_FORGET_TICKS = (
    "DELETE FROM schedule_ticks WHERE queue = ?1 AND name = ?2 AND tick < (SELECT tick FROM "
    "schedule_ticks WHERE queue = ?1 AND name = ?2 ORDER BY tick DESC LIMIT 1 OFFSET ?3)"
)
_LAST_TICK = "SELECT last FROM schedules WHERE queue = ? AND name = ?"
# Workers' reports (``reports.py``): made when first needed, outside the versioned schema, so
# that files of older versions work unchanged.
_REPORT_TABLES = (
    "CREATE TABLE IF NOT EXISTS worker_reports (worker_id TEXT PRIMARY KEY, "
    "deadline REAL NOT NULL, record BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS worker_totals (queue TEXT NOT NULL, task TEXT NOT NULL, "
    "processed INTEGER NOT NULL, failed INTEGER NOT NULL, retried INTEGER NOT NULL, "
    "dead_lettered INTEGER NOT NULL, PRIMARY KEY (queue, task)) WITHOUT ROWID",
)
_UPSERT_REPORT = (
    "INSERT INTO worker_reports (worker_id, deadline, record) VALUES (?, ?, ?) "
    "ON CONFLICT (worker_id) DO UPDATE SET deadline = excluded.deadline, "
    "record = excluded.record"
)
_ADD_TOTALS = (
    "INSERT INTO worker_totals VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (queue, task) DO UPDATE "
    "SET processed = processed + excluded.processed, failed = failed + excluded.failed, "
    "retried = retried + excluded.retried, dead_lettered = dead_lettered + excluded.dead_lettered"
)
_eta_of = attrgetter("eta")
_queue_of = attrgetter("queue")
_priority_of = attrgetter("priority")
_receipt_of = attrgetter("receipt")
_held_order = itemgetter(0, 1, 2)

Rows = list[tuple[str, int, int, bytes]]  # (queue, priority, id, body)


def _clamp(priority: int) -> int:
    return min(max(priority, MIN_PRIORITY), MAX_PRIORITY)


def _next_ids(conn: sqlite3.Connection, n: int) -> int:
    """Reserve ``n`` new message ids; returns the first. Call in a write transaction."""
    end: int = conn.execute(_NEXT_IDS, (n,)).fetchone()[0]
    return end - n


def _requeue(conn: sqlite3.Connection, rows: Rows) -> int:
    """Insert held rows (already deleted) again as ready, under new ids, at the back of their
    priority and in their order among themselves; returns how many."""
    if not rows:
        return 0
    rows.sort(key=_held_order)
    start = _next_ids(conn, len(rows))
    conn.executemany(_INSERT, [(q, p, start + i, body) for i, (q, p, _, body) in enumerate(rows)])
    return len(rows)


def _insert_run(
    conn: sqlite3.Connection, queue: str, priority: int, start: int, payloads: Sequence[bytes]
) -> None:
    """Insert ``payloads`` as ready rows of one ``(queue, priority)`` under the ids ``start``,
    ``start + 1``, … in their order (``_INSERT_RUNS``)."""
    done, n = 0, len(payloads)
    for size, statement in _INSERT_RUNS:
        while n - done >= size:
            conn.execute(statement, (queue, priority, start + done, *payloads[done : done + size]))
            done += size
    if done < n:
        conn.executemany(
            _INSERT, [(queue, priority, start + i, payloads[i]) for i in range(done, n)]
        )


def _group(deliveries: Sequence[Delivery]) -> dict[tuple[str, int], list[int]]:
    """Receipts as ``{(queue, priority): [id, ...]}``."""
    receipts = list(map(_receipt_of, deliveries))
    queues = set(map(_queue_of, deliveries))
    if len(queues) == 1:  # the usual batch: one queue, and most often one priority
        priorities = set(map(and_, receipts, repeat(_PRIORITY_MASK)))
        if len(priorities) == 1:
            key = (queues.pop(), priorities.pop())
            return {key: list(map(rshift, receipts, repeat(_PRIORITY_BITS)))}
    groups: dict[tuple[str, int], list[int]] = {}
    for d in deliveries:
        receipt = d.receipt
        key = (d.queue, receipt & _PRIORITY_MASK)
        ids = groups.get(key)
        if ids is None:
            groups[key] = ids = []
        ids.append(receipt >> _PRIORITY_BITS)
    return groups


def _settle_range(ids: list[int]) -> tuple[int, int] | None:
    """``(lowest, highest)`` when ``ids`` are every whole number from the one to the other,
    each once (settled by one range of the key, not a list), else None."""
    lo, hi = min(ids), max(ids)
    if hi - lo + 1 == len(ids) and len(set(ids)) == len(ids):
        return lo, hi
    return None


def _report_tables(conn: sqlite3.Connection) -> None:
    for statement in _REPORT_TABLES:
        conn.execute(statement)


def _dead_row(queue: str, reason: str, body: bytes, now: float) -> tuple[object, ...]:
    """The parameters of ``_INSERT_DEAD`` for a new dead letter."""
    return (new_id(), queue, reason, body, now, message_id(body) or None)


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)
