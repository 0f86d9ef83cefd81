"""``sqlite:///path``: the embedded default — durable, zero setup, several processes on one host.

Storage. One database file in WAL mode with ``synchronous=NORMAL`` (a commit survives a crash of
the process; a power cut may lose the last commits). Tables:

* ``messages`` — every message not yet settled. Its ``owner`` column is its state: NULL = ready,
  ``''`` = delayed (waiting for ``eta``), a worker id = held by that worker. A delivery's receipt
  is its row id. Two partial indexes keep the hot path short: ``(queue, priority DESC)`` over
  ready rows only serves the claim (a claim just leaves it, an ack touches no index), and
  ``(queue, eta)`` over delayed rows only, so a far-future backlog never slows a claim. Held rows
  are not indexed: finding them by owner is a scan, done only to recover a dead worker's
  deliveries and to count ``in_flight`` in ``stats``; a consumer closes by the ids it holds.
* ``workers`` — one row per live consumer and its last heartbeat.
* ``dead`` — dead letters, oldest first by row id.
* ``queues`` — every queue ever published to.

Every operation is one transaction of a few statements per *batch*: publish is one
``executemany``, fetch one ``UPDATE … RETURNING`` per queue, ack one ``DELETE`` over a JSON array
of row ids. Writes start with ``BEGIN IMMEDIATE`` so that two processes never deadlock upgrading a
read lock to a write lock; a busy file is waited for (``busy_timeout``), not reported.

Delayed rows are promoted (owner ``''`` -> NULL) by the fetch that finds them due. They keep
their row id, so among messages of one priority they come in the order they were published.

Waiting. SQLite cannot notify another process, so a fetch that finds nothing sleep-polls, cheaply:

* publishes, releases, retries and recoveries through the same broker object wake it at once
  (``threading.Condition``);
* commits of other connections (other processes, other broker objects) show in
  ``PRAGMA data_version``, a per-connection counter that costs microseconds and reads no table.
  It is checked after 1 ms, then at intervals doubling up to 25 ms; only when it changed are the
  queues probed (a read), and only when the probe sees something ready is the write lock taken;
* the nearest delayed ``eta`` of the consumer's queues ends the wait too.

So an idle worker picks up a message sent from another process within ~25 ms, for about forty
trivial reads a second.

Connections. One connection per broker object, guarded by a lock: a broker and its consumers can
be used from several threads; blocking waits do not hold the lock. A forked child opens its own
connection on first use (a SQLite connection must not cross ``fork``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter, itemgetter
from pathlib import Path

from ..errors import BrokerError, ConfigurationError
from ..ids import new_id
from ..message import Message, encode_many
from .base import Broker, Consumer, DeadLetter, Delivery, QueueStats

__all__ = ["SQLiteBroker"]

log = logging.getLogger(__name__)

#: The ``owner`` of a delayed row. Worker ids are never empty.
_DELAYED = ""
_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_MS = 30_000
_POLL_FIRST = 0.001
_POLL_MAX = 0.025

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id       INTEGER PRIMARY KEY,
    queue    TEXT    NOT NULL,
    priority INTEGER NOT NULL,
    eta      REAL    NOT NULL,
    owner    TEXT,
    body     BLOB    NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_ready ON messages (queue, owner, priority DESC)
    WHERE owner IS NULL;
CREATE INDEX IF NOT EXISTS messages_delayed ON messages (queue, eta) WHERE owner = '';
CREATE TABLE IF NOT EXISTS workers (
    worker_id TEXT PRIMARY KEY,
    last_seen REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead (
    seq       INTEGER PRIMARY KEY,
    id        TEXT    NOT NULL UNIQUE,
    queue     TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    body      BLOB    NOT NULL,
    failed_at REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_queue ON dead (queue);
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY) WITHOUT ROWID;
"""

_INSERT = "INSERT INTO messages (queue, priority, eta, owner, body) VALUES (?, ?, ?, ?, ?)"
_ADD_QUEUE = "INSERT OR IGNORE INTO queues (name) VALUES (?)"
_UPSERT_WORKER = (
    "INSERT INTO workers (worker_id, last_seen) VALUES (?, ?) "
    "ON CONFLICT (worker_id) DO UPDATE SET last_seen = excluded.last_seen"
)
_CLAIM = (
    "UPDATE messages SET owner = ?1 WHERE id IN ("
    "SELECT id FROM messages WHERE queue = ?2 AND owner IS NULL "
    "ORDER BY priority DESC, id LIMIT ?3) RETURNING id, priority, body"
)
_SETTLE = "DELETE FROM messages WHERE id = ? AND owner = ?"
_IDS = "SELECT value FROM json_each(?)"
_by_priority = itemgetter(1)
_by_id = itemgetter(0)
_queue_of = attrgetter("queue")


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


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)


class SQLiteBroker(Broker):
    """The contract on one SQLite file, shared by every process and thread that opens it."""

    def __init__(
        self, url: str = "sqlite:///hurtle.db", *, heartbeat_timeout: float = 20.0
    ) -> None:
        self.url = url
        self.heartbeat_timeout = heartbeat_timeout
        self.path = _path_of(url)
        self._lock = threading.Lock()
        self._wake = threading.Condition(threading.Lock())
        self._ticket = 0  # bumped (under _wake) by every local commit that may make work ready
        self._known: set[str] = set()  # queues this object knows are in the queues table
        self._closed = False
        self._pid = os.getpid()
        self._conn = self._open()

    # -- connection and transactions -------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
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
                conn.execute("PRAGMA synchronous = NORMAL")
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
            if version < _SCHEMA_VERSION:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
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

    def _add_queues(self, conn: sqlite3.Connection, names: Iterable[str]) -> list[str]:
        new = [n for n in names if n not in self._known]
        if new:
            conn.executemany(_ADD_QUEUE, [(n,) for n in new])
        return new

    # -- producer side ---------------------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        payloads = encode_many(list(messages))
        now = time.time()
        rows = [
            (m.queue, m.priority, m.eta, None if m.eta <= now else _DELAYED, raw)
            for m, raw in zip(messages, payloads, strict=True)
        ]
        with self._write() as conn:
            new = self._add_queues(conn, set(map(_queue_of, messages)))
            conn.executemany(_INSERT, rows)
        self._known.update(new)
        self._notify()

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        if not payloads:
            return
        rows = [(queue, 0, 0.0, None, bytes(raw)) for raw in payloads]
        with self._write() as conn:
            new = self._add_queues(conn, (queue,))
            conn.executemany(_INSERT, rows)
        self._known.update(new)
        self._notify()

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
            for queue, n in conn.execute(
                f"SELECT queue, count(*) FROM messages WHERE queue IN ({_IDS}) "
                "AND owner IS NULL GROUP BY queue",
                wanted,
            ):
                counts[queue][0] += n
            for queue, due, n in conn.execute(  # delayed rows already due are ready
                f"SELECT queue, eta <= ?, count(*) FROM messages WHERE queue IN ({_IDS}) "
                "AND owner = '' GROUP BY 1, 2",
                (now, wanted[0]),
            ):
                counts[queue][0 if due else 1] += n
            for queue, n in conn.execute(  # held rows have no index: this one scans
                f"SELECT queue, count(*) FROM messages WHERE queue IN ({_IDS}) "
                "AND owner > '' GROUP BY queue",
                wanted,
            ):
                counts[queue][2] += n
            for queue, n in conn.execute(
                f"SELECT queue, count(*) FROM dead WHERE queue IN ({_IDS}) GROUP BY queue",
                wanted,
            ):
                counts[queue][3] += n
        return {
            name: QueueStats(ready=c[0], delayed=c[1], in_flight=c[2], dead=c[3])
            for name, c in counts.items()
        }

    def recover(self) -> int:
        with self._write() as conn:
            moved = self._recover_in(conn, time.time())
        if moved:
            self._notify()
        return moved

    def _recover_in(self, conn: sqlite3.Connection, now: float) -> int:
        dead = [
            r[0]
            for r in conn.execute(
                "SELECT worker_id FROM workers WHERE last_seen < ?",
                (now - self.heartbeat_timeout,),
            )
        ]
        if not dead:
            return 0
        ids = (json.dumps(dead),)
        moved: int = conn.execute(
            f"UPDATE messages SET owner = NULL WHERE owner IN ({_IDS})",
            ids,
        ).rowcount
        conn.execute(f"DELETE FROM workers WHERE worker_id IN ({_IDS})", ids)
        if moved:
            log.warning("recovered %d deliveries held by silent workers %s", moved, dead)
        return moved

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
        marks = _placeholders(len(queues))
        self._promote_sql = (
            f"UPDATE messages SET owner = NULL WHERE queue IN ({marks}) AND owner = '' AND eta <= ?"
        )
        self._probe_sql = "SELECT " + ", ".join(
            [f"EXISTS (SELECT 1 FROM messages WHERE queue IN ({marks}) AND owner IS NULL)"]
            + ["(SELECT min(eta) FROM messages WHERE queue = ? AND owner = '')"] * len(queues)
        )
        self._held: set[int] = set()  # receipts fetched and not yet settled here
        with broker._write() as conn:
            conn.execute(_UPSERT_WORKER, (worker_id, time.time()))

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
        receipts = [d.receipt for d in deliveries]
        out = self._claim(max_count, settle=receipts)
        self._held.difference_update(receipts)
        return out or self.fetch(max_count, timeout)

    def _claim(self, max_count: int, settle: list[int] | None = None) -> list[Delivery]:
        worker_id = self.worker_id
        out: list[Delivery] = []
        with self.broker._write() as conn:
            now = time.time()
            if settle:
                conn.execute(
                    f"DELETE FROM messages WHERE id IN ({_IDS}) AND owner = ?",
                    (json.dumps(settle), worker_id),
                )
            # Re-register if declared dead meanwhile, so that what it takes stays recoverable.
            conn.execute(
                "INSERT OR IGNORE INTO workers (worker_id, last_seen) VALUES (?, ?)",
                (worker_id, now),
            )
            conn.execute(self._promote_sql, (*self.queues, now))
            for queue in self.queues:
                rows = conn.execute(_CLAIM, (worker_id, queue, max_count - len(out))).fetchall()
                if rows:
                    # RETURNING promises no order: restore priority first, then oldest first.
                    rows.sort(key=_by_id)
                    rows.sort(key=_by_priority, reverse=True)
                    out += [Delivery(queue, body, rowid) for rowid, _, body in rows]
                    self._held.update(map(_by_id, rows))
                    if len(out) >= max_count:
                        break
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
    # is left to whoever holds it now: settling it here would run or drop it twice.

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        receipts = [d.receipt for d in deliveries]
        with self.broker._write() as conn:
            conn.execute(
                f"DELETE FROM messages WHERE id IN ({_IDS}) AND owner = ?",
                (json.dumps(receipts), self.worker_id),
            )
        self._held.difference_update(receipts)

    def retry(self, delivery: Delivery, message: Message) -> None:
        raw = message.encode()
        b = self.broker
        owner = None if message.eta <= time.time() else _DELAYED
        new: list[str] = []
        with b._write() as conn:
            if conn.execute(_SETTLE, (delivery.receipt, self.worker_id)).rowcount:
                new = b._add_queues(conn, (message.queue,))
                conn.execute(_INSERT, (message.queue, message.priority, message.eta, owner, raw))
        self._held.discard(delivery.receipt)
        b._known.update(new)
        b._notify()

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        with self.broker._write() as conn:
            if conn.execute(_SETTLE, (delivery.receipt, self.worker_id)).rowcount:
                conn.execute(
                    "INSERT INTO dead (id, queue, reason, body, failed_at) VALUES (?, ?, ?, ?, ?)",
                    (new_id(), delivery.queue, reason, delivery.raw, time.time()),
                )
        self._held.discard(delivery.receipt)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        if deliveries:
            self._release([d.receipt for d in deliveries])
            self.broker._notify()

    def _release(self, receipts: list[int]) -> None:
        with self.broker._write() as conn:
            conn.execute(
                f"UPDATE messages SET owner = NULL WHERE id IN ({_IDS}) AND owner = ?",
                (json.dumps(receipts), self.worker_id),
            )
        self._held.difference_update(receipts)

    def heartbeat(self) -> None:
        b = self.broker
        with b._write() as conn:
            now = time.time()
            conn.execute(_UPSERT_WORKER, (self.worker_id, now))
            moved = b._recover_in(conn, now)
        if moved:
            b._notify()

    def close(self) -> None:
        b = self.broker
        if b._closed:
            return
        with b._write() as conn:
            conn.execute(
                f"UPDATE messages SET owner = NULL WHERE id IN ({_IDS}) AND owner = ?",
                (json.dumps(list(self._held)), self.worker_id),
            )
            conn.execute("DELETE FROM workers WHERE worker_id = ?", (self.worker_id,))
        self._held.clear()
        b._notify()
