"""``sqlite:///path``: the embedded default — durable, zero setup, several processes on one host.

Durability. One database file in WAL mode. By default every commit is flushed to the disk before it
returns (``synchronous=FULL``): a ``publish`` that returned, an ack, a retry or a dead letter
survives a crash of the process *and* of the machine (a power cut). The URL option
``?synchronous=normal`` skips that flush (``synchronous=NORMAL``): a commit still survives a crash
of the process and the file is never corrupted, but a power cut or kernel crash may lose the last
commits — a returned publish, or an ack (the task then runs again). The flush is paid per
transaction, that is per *batch*: measured with ``benchmarks/sqlite_synchronous.py`` (2 cores, ext4
on a virtual disk), ``full`` costs 7 to 13% of publish and 14 to 23% of fetch+ack throughput in
batches of 1,000 (6 to 10% of ``hurtle demo``), and makes one-message-at-a-time publishing 5x slower
(4,000 to 4,600/s instead of 22,000 to 24,000/s); a disk with a slower flush widens the gap. The
level holds per connection: each process gets what its own URL says. No other ``?option`` is
accepted.

Storage. A log and a cursor per priority, so that the hot path writes each message once and
deletes it once, like a plain insert-then-delete loop:

* ``messages`` — every ready or held message, keyed ``(queue, priority, id)`` (``WITHOUT
  ROWID``: the key *is* the table, no second index). Ids come from the one-row ``seq`` counter,
  one ``UPDATE … RETURNING`` per batch; they strictly increase across processes (writes are
  serialized) and are never reused.
* ``cursors`` — per ``(queue, priority)``, the last id claimed: rows above it are ready, rows at
  or below it that still exist are held by some claim. Fetching moves the cursor; it rewrites
  no message.
* ``claims`` — one row per ``(queue, priority)`` range of ids a fetch took, with the worker that
  took it: a worker holds the surviving rows of its claims' ranges. A claim row whose range is
  empty is dropped when an ack reaches it, and on heartbeat and close. A delivery's receipt packs
  its id and priority (``id * 16 + priority``; the queue is on the ``Delivery``).
* ``delayed`` — messages waiting for their ``eta``, indexed by ``(queue, eta)`` so that a
  far-future backlog never slows a claim. The fetch that finds them due moves them to
  ``messages`` under new ids, in the order they were published.
* ``workers`` — one row per live consumer and its deadline: the time of its last heartbeat plus
  its *own* heartbeat timeout, so that a peer with a shorter timeout never takes what a live
  worker with a longer one holds. Recovery re-queues what workers whose deadline passed held.
* ``dead`` — dead letters, oldest first by row id. Each dead-letter write drops, in its own
  transaction, those of its queue past ``dead_letter_ttl`` and then the oldest beyond
  ``dead_letter_max`` (expiry goes by the order they were recorded).
* ``queues`` — every queue ever published to.
* ``schedules`` — per ``(queue, name)`` of a periodic task, the last tick claimed
  (``claim_tick``: the check, the record and the publish in one transaction). Made by the first
  claim, so files of older versions need no upgrade.
* ``results`` — task results by message id with their expiry (``Consumer.ack(..., results)``),
  written in the acknowledgement's transaction; each such write first deletes up to 100 expired
  rows (an index seek on ``expires`` that finds nothing, most of the time). Made with ``IF NOT
  EXISTS`` when a file is opened: an additive table that older versions ignore.
* ``deaths``, ``quarantine``, ``probes`` — poison messages (a task that kills its process), as in
  the Redis broker (``lua/heartbeat.lua``): recovery counts a death per recovered message (by
  sha1 of its bytes; at most ``MAX_DEATHS`` rows, those with the fewest deaths go first). A
  message recovered for the first time goes back to the queue; one recovered again waits in
  ``quarantine``, away from the innocent messages it keeps coming back with, and recovery lets
  those out one at a time (a *probe*, recorded in ``probes`` until it is settled or recovered;
  the next once the previous was fetched). A probe whose dead worker held no other probe (in any
  queue) was the likely killer: past ``max_recoveries`` deaths it becomes a dead letter ("its
  worker died N times while holding it"), else it goes back to quarantine. Quarantined messages
  count as ready in ``stats``.

Priorities are 0..9 (the task API checks them); a raw ``Message`` outside that range is stored
at the nearest end.

Every operation is one transaction of a few statements per *batch*: publish is one counter
update and one ``executemany``; fetch reads each priority of each queue above its cursor, moves
the cursor and records the claim; ack is one ``DELETE`` over a JSON array of ids per
``(queue, priority)``. A solo worker's ``ack_and_fetch`` does its acks and its next claim in one
transaction. Writes start with ``BEGIN IMMEDIATE`` so that two processes never deadlock upgrading
a read lock to a write lock; a busy file is waited for (``busy_timeout``), not reported.

Settling, and what goes back. A receipt names one row; a row whose holder was declared dead was
re-queued under a new id, so a late ack, retry or dead letter of it finds nothing and does
nothing. ``release``, ``close`` and the recovery of a dead worker's deliveries re-insert the
surviving rows under *new* ids: unlike the Redis broker (which puts them back at the front),
released and recovered messages go to the back of their priority, in their original order among
themselves. A retry is the next attempt, published anew (delayed or ready).

Waiting. SQLite cannot notify another process, so a fetch that finds nothing sleep-polls, cheaply:

* publishes, releases, retries and recoveries through the same broker object wake it at once
  (``threading.Condition``);
* commits of other connections (other processes, other broker objects) show in
  ``PRAGMA data_version``, a per-connection counter that costs microseconds and reads no table.
  It is checked after 1 ms, then at intervals doubling up to 25 ms; only when it changed are the
  queues probed (a read: any row above a cursor, the nearest delayed ``eta``), and only when the
  probe sees something ready is the write lock taken;
* the nearest delayed ``eta`` of the consumer's queues ends the wait too.

So an idle worker picks up a message sent from another process within ~25 ms, for about forty
trivial reads a second.

Connections. One connection per broker object, guarded by a lock: a broker and its consumers can
be used from several threads; blocking waits do not hold the lock. A forked child opens its own
connection on first use (a SQLite connection must not cross ``fork``).

Schema. The file records its schema version (``PRAGMA user_version``). A file of the previous
version is upgraded in place (``_UPGRADES``); an older one is refused with a
``ConfigurationError`` (delete or move it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter, itemgetter
from pathlib import Path
from urllib.parse import parse_qsl

from ..errors import BrokerError, ConfigurationError
from ..ids import new_id
from ..message import MAX_PRIORITY, MIN_PRIORITY, Message, check_messages, encode_many
from ..settings import DEFAULT_DEAD_LETTER_MAX, DEFAULT_DEAD_LETTER_TTL
from .base import (
    Broker,
    Consumer,
    DeadLetter,
    Delivery,
    QueueStats,
    StoredResult,
    check_dead_letter_limits,
    check_tick_claim,
    gcra,
    log_trimmed,
    unique_key_of,
)
from .reports import TaskCounts, WorkerReport, decode_report, encode_report

__all__ = ["SQLiteBroker"]

log = logging.getLogger(__name__)

#: ``?synchronous=`` levels a SQLite URL may ask for, and the one it gets without asking.
SYNCHRONOUS_LEVELS = ("full", "normal")
DEFAULT_SYNCHRONOUS = "full"

_SCHEMA_VERSION = 4
_BUSY_TIMEOUT_MS = 30_000
_POLL_FIRST = 0.001
_POLL_MAX = 0.025
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
    failed_at REAL    NOT NULL
);
CREATE INDEX dead_queue ON dead (queue);
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
}
#: Most recovered messages whose deaths the file remembers (those with the fewest go first).
MAX_DEATHS = 10_000

_RESULTS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, expires REAL NOT NULL, "
    "body BLOB NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS results_expires ON results (expires)",
)
_PUT_RESULT = "INSERT OR REPLACE INTO results (id, expires, body) VALUES (?, ?, ?)"
_EXPIRE_RESULTS = (
    "DELETE FROM results WHERE id IN (SELECT id FROM results WHERE expires <= ? LIMIT 100)"
)
_GET_RESULT = "SELECT body FROM results WHERE id = ? AND expires > ?"

_IDS = "SELECT value FROM json_each(?)"
_NEXT_IDS = "UPDATE seq SET next = next + ? RETURNING next"
_INSERT = "INSERT INTO messages (queue, priority, id, body) VALUES (?, ?, ?, ?)"
_INSERT_DELAYED = "INSERT INTO delayed (queue, eta, priority, body) VALUES (?, ?, ?, ?)"
_ADD_QUEUE = "INSERT OR IGNORE INTO queues (name) VALUES (?)"
_ADD_CURSOR = "INSERT OR IGNORE INTO cursors (queue, priority, last) VALUES (?, ?, 0)"
_UPSERT_WORKER = (
    "INSERT INTO workers (worker_id, deadline) VALUES (?, ?) "
    "ON CONFLICT (worker_id) DO UPDATE SET deadline = excluded.deadline"
)
_CURSORS = "SELECT priority, last FROM cursors WHERE queue = ? ORDER BY priority DESC"
_TAKE = (
    "SELECT id, body FROM messages WHERE queue = ? AND priority = ? AND id > ? ORDER BY id LIMIT ?"
)
_MOVE_CURSOR = "UPDATE cursors SET last = ? WHERE queue = ? AND priority = ?"
_ADD_CLAIM = "INSERT INTO claims (worker, queue, priority, lo, hi) VALUES (?, ?, ?, ?, ?)"
_SETTLE = "DELETE FROM messages WHERE queue = ? AND priority = ? AND id = ?"
_SETTLE_MANY = f"DELETE FROM messages WHERE queue = ? AND priority = ? AND id IN ({_IDS})"
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
_INSERT_DEAD = "INSERT INTO dead (id, queue, reason, body, failed_at) VALUES (?, ?, ?, ?, ?)"
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
# A row comes back only when this call recorded the tick: new, or newer than the last one.
_CLAIM_TICK = (
    "INSERT INTO schedules (queue, name, last) VALUES (?, ?, ?) ON CONFLICT (queue, name) "
    "DO UPDATE SET last = excluded.last WHERE schedules.last < excluded.last RETURNING last"
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


def _group(deliveries: Sequence[Delivery]) -> dict[tuple[str, int], list[int]]:
    """Receipts as ``{(queue, priority): [id, ...]}``."""
    groups: dict[tuple[str, int], list[int]] = {}
    for d in deliveries:
        receipt = d.receipt
        key = (d.queue, receipt & _PRIORITY_MASK)
        ids = groups.get(key)
        if ids is None:
            groups[key] = ids = []
        ids.append(receipt >> _PRIORITY_BITS)
    return groups


def _path_of(url: str) -> Path:
    """``sqlite:///rel/x.db`` -> ``rel/x.db``; ``sqlite:////abs/x.db`` -> ``/abs/x.db``."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "sqlite" or not sep:
        raise ConfigurationError(f"not a SQLite URL: {url!r}; use sqlite:///path/to/file.db")
    rest = rest.split("?", 1)[0]
    if not rest.startswith("/") or len(rest) < 2:
        raise ConfigurationError(
            f"bad SQLite URL {url!r}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db (three slashes, then the path)"
        )
    return Path(rest[1:])


def _synchronous_of(url: str) -> str:
    """The ``PRAGMA synchronous`` level a SQLite URL asks for (``?synchronous=full|normal``).

    The query string holds options only; any other option, or another level, is refused.
    """
    query = url.partition("?")[2]
    level = DEFAULT_SYNCHRONOUS
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "synchronous":
            raise ConfigurationError(
                f"unknown option {name!r} in the SQLite URL {url!r}: the only option is "
                "synchronous (sqlite:///path.db?synchronous=full or normal)"
            )
        level = value.strip().lower()
        if level not in SYNCHRONOUS_LEVELS:
            raise ConfigurationError(
                f"synchronous={value!r} in the SQLite URL {url!r} is not a level hurtle "
                f"offers: use one of {', '.join(SYNCHRONOUS_LEVELS)}"
            )
    return level


def _report_tables(conn: sqlite3.Connection) -> None:
    for statement in _REPORT_TABLES:
        conn.execute(statement)


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)


class SQLiteBroker(Broker):
    """The contract on one SQLite file, shared by every process and thread that opens it."""

    def __init__(
        self,
        url: str = "sqlite:///hurtle.db",
        *,
        heartbeat_timeout: float = 20.0,
        dead_letter_max: int = DEFAULT_DEAD_LETTER_MAX,
        dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL,
        max_recoveries: int = 3,
    ) -> None:
        self.dead_letter_max, self.dead_letter_ttl = check_dead_letter_limits(
            dead_letter_max, dead_letter_ttl
        )
        self.url = url
        self.heartbeat_timeout = heartbeat_timeout
        self.max_recoveries = max_recoveries
        self.path = _path_of(url)
        self.synchronous = _synchronous_of(url)
        self._lock = threading.Lock()
        self._wake = threading.Condition(threading.Lock())
        self._ticket = 0  # bumped (under _wake) by every local commit that may make work ready
        # (queue, priority) pairs this object knows have a cursor (and their queue a name row)
        self._known: set[tuple[str, int]] = set()
        self._closed = False
        self._pid = os.getpid()
        self._conn = self._open()

    # -- connection and transactions -------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            if not self.path.parent.is_dir():  # a typo must not quietly start an empty queue
                raise FileNotFoundError(f"no directory {str(self.path.parent.absolute())!r}")
            conn = sqlite3.connect(
                self.path,
                timeout=_BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
                if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                    raise sqlite3.OperationalError("the file cannot be put in WAL mode")
                conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
                self._migrate(conn)
            except BaseException:
                conn.close()
                raise
        except (OSError, sqlite3.Error) as err:
            raise ConfigurationError(
                f"cannot open the SQLite broker file {str(self.path)!r} (from {self.url!r}): "
                f"{err}; check that the path names a writable file in a writable directory"
            ) from err
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"schema version {version} is newer than this hurtle ({_SCHEMA_VERSION})"
                )
            while 0 < version < _SCHEMA_VERSION and version in _UPGRADES:
                for statement in _UPGRADES[version].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                version += 1
                conn.execute(f"PRAGMA user_version = {version}")
            if 0 < version < _SCHEMA_VERSION:
                raise ConfigurationError(
                    f"the SQLite broker file {str(self.path)!r} (from {self.url!r}) was written "
                    f"by an older hurtle (schema version {version}; this one uses "
                    f"{_SCHEMA_VERSION}) and cannot be upgraded: delete it or move it away "
                    "(whatever it still holds is lost to this hurtle), then start again"
                )
            if version < _SCHEMA_VERSION:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            for statement in _RESULTS_SCHEMA:
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _connection(self) -> sqlite3.Connection:
        """The connection, reopened in a forked child. Call with ``_lock`` held."""
        if self._closed:
            raise BrokerError(f"the SQLite broker {self.url!r} is closed")
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._conn = self._open()  # never touch the parent's connection
        return self._conn

    def _after_fork_check(self) -> None:
        if self._pid != os.getpid():  # a lock held by another thread at fork time stays held
            self._lock = threading.Lock()
            self._wake = threading.Condition(threading.Lock())

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) on the shared connection."""
        self._after_fork_check()
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as err:
                raise BrokerError(f"SQLite broker {self.url!r}: {err}") from err

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot across several statements."""
        self._after_fork_check()
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
            except sqlite3.Error as err:
                raise BrokerError(f"SQLite broker {self.url!r}: {err}") from err

    def _notify(self) -> None:
        with self._wake:
            self._ticket += 1
            self._wake.notify_all()

    def _register(
        self, conn: sqlite3.Connection, pairs: set[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """Make sure these (queue, priority) pairs have a cursor; returns those this object did
        not know of, to add to ``_known`` once the transaction committed."""
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
        payloads = encode_many(list(messages))
        now = time.time()
        pairs = {(m.queue, m.priority) for m in messages}
        if max(map(_eta_of, messages)) <= now:
            # the common case: every message ready, one pass to build the rows
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
        payloads = encode_many(list(messages))
        out: list[str] = []
        items: list[tuple[str, int, float, bytes]] = []
        with self._write() as conn:
            now = time.time()
            conn.execute(  # a bounded sweep of expired locks
                "DELETE FROM uniques WHERE (queue, key) IN (SELECT queue, key FROM uniques "
                "WHERE expires <= ? LIMIT 1000)",
                (now,),
            )
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
                    (m.queue, key, m.id, now + unique_for),
                )
                items.append((m.queue, m.priority, m.eta, raw))
                out.append(m.id)
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

    def claim_tick(self, queue: str, name: str, tick: float, messages: Sequence[Message]) -> bool:
        check_tick_claim(queue, tick, messages)
        check_messages(messages)
        payloads = encode_many(list(messages))
        now = time.time()
        items = [
            (m.queue, m.priority, m.eta, raw) for m, raw in zip(messages, payloads, strict=True)
        ]
        with self._write() as conn:
            conn.execute(_SCHEDULES)
            won = conn.execute(_CLAIM_TICK, (queue, name, float(tick))).fetchone() is not None
            new = self._store(conn, items, now) if won else set()
        self._known.update(new)
        if won:
            self._notify()
        return won

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
        return {
            name: QueueStats(ready=c[0], delayed=c[1], in_flight=c[2], dead=c[3])
            for name, c in counts.items()
        }

    def recover(self) -> int:
        with self._write() as conn:
            moved, released, _ = self._recover_in(conn, time.time())
        if moved or released:
            self._notify()
        return moved

    def _recover_in(self, conn: sqlite3.Connection, now: float) -> tuple[int, bool, bool]:
        """Forget workers whose deadline passed, and re-queue what every claim of a worker not
        in ``workers`` still holds (theirs, and any left without a worker); then let one
        quarantined message out per queue. Returns (deliveries recovered, whether one was let
        out, whether more wait in quarantine)."""
        dead = [
            r[0] for r in conn.execute("SELECT worker_id FROM workers WHERE deadline < ?", (now,))
        ]
        if dead:
            conn.execute(f"DELETE FROM workers WHERE worker_id IN ({_IDS})", (json.dumps(dead),))
        # one row per outstanding batch, not per message: this scan stays short
        orphans = conn.execute(
            "SELECT batch, worker, queue, priority, lo, hi FROM claims "
            "WHERE worker NOT IN (SELECT worker_id FROM workers)"
        ).fetchall()
        moved = 0
        if orphans:
            held: dict[str, Rows] = {}
            for _, worker, queue, priority, lo, hi in orphans:
                held.setdefault(worker, []).extend(
                    conn.execute(_TAKE_BACK_RANGE, (queue, priority, lo, hi)).fetchall()
                )
            conn.execute(
                f"DELETE FROM claims WHERE batch IN ({_IDS})",
                (json.dumps([c[0] for c in orphans]),),
            )
            back: Rows = []
            for rows in held.values():
                back += self._sort_out(conn, rows, now)
                moved += len(rows)
            _requeue(conn, back)
            if moved:
                log.warning(
                    "recovered %d deliveries held by silent workers %s",
                    moved,
                    sorted({c[1] for c in orphans}),
                )
                extra = conn.execute("SELECT count(*) FROM deaths").fetchone()[0] - MAX_DEATHS
                if extra > 0:
                    conn.execute(
                        "DELETE FROM deaths WHERE (queue, digest) IN (SELECT queue, digest "
                        "FROM deaths ORDER BY n LIMIT ?)",
                        (extra,),
                    )
        return moved, *self._let_out(conn)

    def _sort_out(self, conn: sqlite3.Connection, rows: Rows, now: float) -> Rows:
        """Count a death for each row one dead worker held; quarantine those that died before
        and dead-letter a lone probe past ``max_recoveries``. Returns the rows to re-queue."""
        digests = [hashlib.sha1(body).hexdigest() for _, _, _, body in rows]
        probe = [
            conn.execute(
                "DELETE FROM probes WHERE queue = ? AND digest = ? RETURNING 1", (row[0], digest)
            ).fetchone()
            is not None
            for row, digest in zip(rows, digests, strict=True)
        ]
        lone = sum(probe) == 1  # across all its queues, unlike Redis (one queue per script)
        back: Rows = []
        for row, digest, is_probe in zip(rows, digests, probe, strict=True):
            queue, priority, _, body = row
            deaths: int = conn.execute(
                "INSERT INTO deaths (queue, digest, n) VALUES (?, ?, 1) "
                "ON CONFLICT (queue, digest) DO UPDATE SET n = n + 1 RETURNING n",
                (queue, digest),
            ).fetchone()[0]
            if is_probe and lone and deaths > self.max_recoveries:
                conn.execute("DELETE FROM deaths WHERE queue = ? AND digest = ?", (queue, digest))
                conn.execute(
                    "INSERT INTO dead (id, queue, reason, body, failed_at) VALUES (?, ?, ?, ?, ?)",
                    (
                        new_id(),
                        queue,
                        f"its worker died {deaths} times while holding it (max_recoveries is "
                        f"{self.max_recoveries})",
                        body,
                        now,
                    ),
                )
            elif deaths >= 2:
                conn.execute(
                    "INSERT INTO quarantine (queue, priority, body) VALUES (?, ?, ?)",
                    (queue, priority, body),
                )
            else:
                back.append(row)
        return back

    def _let_out(self, conn: sqlite3.Connection) -> tuple[bool, bool]:
        """Per queue, let one quarantined message out unless the last one is still ready.
        Returns (whether one was let out, whether more wait).

        One statement when nothing waits: it runs on every heartbeat, and a heartbeat thread
        competing for the GIL with a task that computes pays for each statement."""
        queues = conn.execute("SELECT DISTINCT queue FROM quarantine").fetchall()
        if not queues:
            return False, False
        # a probe whose row is gone was settled (or recovered: then it was handled above)
        conn.execute(
            "DELETE FROM probes WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE "
            "m.queue = probes.queue AND m.priority = probes.priority AND m.id = probes.id)"
        )
        released = False
        for (queue,) in queues:
            waiting = conn.execute(
                "SELECT 1 FROM probes p JOIN cursors c ON c.queue = p.queue "
                "AND c.priority = p.priority WHERE p.queue = ? AND p.id > c.last",
                (queue,),
            ).fetchone()
            if waiting:
                continue
            seq, priority, body = conn.execute(
                "SELECT seq, priority, body FROM quarantine WHERE queue = ? ORDER BY seq LIMIT 1",
                (queue,),
            ).fetchone()
            conn.execute("DELETE FROM quarantine WHERE seq = ?", (seq,))
            id_ = _next_ids(conn, 1)
            conn.execute(_INSERT, (queue, priority, id_, body))
            conn.execute(
                "INSERT OR REPLACE INTO probes (queue, digest, priority, id) VALUES (?, ?, ?, ?)",
                (queue, hashlib.sha1(body).hexdigest(), priority, id_),
            )
            released = True
        pending = conn.execute("SELECT EXISTS (SELECT 1 FROM quarantine)").fetchone()[0]
        return released, bool(pending)

    def _trim_dead(self, conn: sqlite3.Connection, queue: str, now: float) -> tuple[int, int]:
        """Drop dead letters past the ttl, then the oldest beyond the cap; (expired, dropped)."""
        expired = dropped = 0
        if self.dead_letter_ttl:
            expired = conn.execute(_EXPIRE_DEAD, (queue, now - self.dead_letter_ttl)).rowcount
        if self.dead_letter_max:
            dropped = conn.execute(_CAP_DEAD, (queue, self.dead_letter_max)).rowcount
        return expired, dropped

    def dead_letters(self, queue: str, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT id, queue, reason, body, failed_at FROM dead WHERE queue = ? "
                "ORDER BY seq LIMIT ? OFFSET ?",
                (queue, limit, offset),
            ).fetchall()
        return [
            DeadLetter(id=r[0], queue=r[1], reason=r[2], raw=r[3], failed_at=r[4]) for r in rows
        ]

    def delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        with self._write() as conn:
            deleted: int = conn.execute(
                f"DELETE FROM dead WHERE queue = ? AND id IN ({_IDS})",
                (queue, json.dumps(list(ids))),
            ).rowcount
        return deleted

    def purge_dead(self, queue: str) -> int:
        with self._write() as conn:
            deleted: int = conn.execute("DELETE FROM dead WHERE queue = ?", (queue,)).rowcount
        return deleted

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


class _SQLiteConsumer(Consumer):
    combines_ack_and_fetch = True

    def __init__(self, broker: SQLiteBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        #: This worker's own timeout: its deadline, as other workers see it, is a beat plus this.
        self.heartbeat_timeout = broker.heartbeat_timeout
        marks = _placeholders(len(queues))
        self._promote_sql = (
            f"DELETE FROM delayed WHERE queue IN ({marks}) AND eta <= ? "
            "RETURNING seq, queue, priority, body"
        )
        self._probe_sql = "SELECT " + ", ".join(
            [
                f"EXISTS (SELECT 1 FROM cursors c WHERE c.queue IN ({marks}) AND EXISTS ("
                "SELECT 1 FROM messages m WHERE m.queue = c.queue AND m.priority = c.priority "
                "AND m.id > c.last))"
            ]
            + ["(SELECT min(eta) FROM delayed WHERE queue = ?)"] * len(queues)
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
            for queue in self.queues:
                for priority, last in conn.execute(_CURSORS, (queue,)).fetchall():
                    rows = conn.execute(
                        _TAKE, (queue, priority, last, max_count - len(out))
                    ).fetchall()
                    if not rows:
                        continue
                    hi = rows[-1][0]
                    conn.execute(_MOVE_CURSOR, (hi, queue, priority))
                    conn.execute(_ADD_CLAIM, (worker_id, queue, priority, rows[0][0], hi))
                    out += [
                        Delivery(queue, body, id_ << _PRIORITY_BITS | priority)
                        for id_, body in rows
                    ]
                    if len(out) >= max_count:
                        return out
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
            conn.execute(_SETTLE_MANY, (queue, priority, json.dumps(ids)))
            conn.execute(_DROP_REACHED, (self.worker_id, queue, priority, max(ids)))

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
            if results:
                now = time.time()
                conn.execute(_EXPIRE_RESULTS, (now,))
                conn.executemany(_PUT_RESULT, [(r.id, now + r.ttl, r.payload) for r in results])
            self._ack_in(conn, groups)

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
                conn.execute(_INSERT_DEAD, (new_id(), delivery.queue, reason, delivery.raw, now))
                expired, dropped = b._trim_dead(conn, delivery.queue, now)
        log_trimmed(b, delivery.queue, expired, dropped)

    def defer(self, delivery: Delivery, eta: float) -> None:
        self.defer_many([(delivery, eta)])

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

    def release_unique(self, locks: Sequence[tuple[str, str, str]]) -> None:
        with self.broker._write() as conn:
            conn.executemany("DELETE FROM uniques WHERE queue = ? AND key = ? AND id = ?", locks)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give them back, under new ids: at the back of their priority (see the module doc)."""
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
        report = self.reporter.report() if self.reporter is not None else None
        with b._write() as conn:
            now = time.time()
            conn.execute(_UPSERT_WORKER, (self.worker_id, now + self.heartbeat_timeout))
            if report is not None:
                _report_tables(conn)
                conn.execute("DELETE FROM worker_reports WHERE deadline < ?", (now,))
                conn.execute(
                    _UPSERT_REPORT,
                    (self.worker_id, now + self.heartbeat_timeout, encode_report(report)),
                )
                conn.executemany(
                    _ADD_TOTALS,
                    [
                        (c.queue, c.task, c.processed, c.failed, c.retried, c.dead_lettered)
                        for c in report.delta
                    ],
                )
            conn.execute(_DROP_EMPTY, (self.worker_id,))
            moved, released, pending = b._recover_in(conn, now)
        if report is not None and self.reporter is not None:
            self.reporter.confirm(report)
        if moved or released:
            b._notify()
        return pending

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        own = SQLiteBroker(
            self.broker.url,
            heartbeat_timeout=self.heartbeat_timeout,
            max_recoveries=self.broker.max_recoveries,
        )
        try:
            beater = _SQLiteConsumer(own, self.queues, self.worker_id)
            beater.reporter = self.reporter
        except BaseException:
            own.close()
            raise
        return beater.heartbeat, own.close

    def close(self) -> None:
        b = self.broker
        if b._closed:
            return
        with b._write() as conn:
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
