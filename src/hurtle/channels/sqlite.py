"""``sqlite:///path`` channels: several processes on one host, through the broker's own file.

Frames go to an append-only table, ``channel_frames (id, channel, frame)``, in the same database
file as the queues (WAL mode), one ``INSERT`` per frame and one transaction per flush. Ids come
from ``AUTOINCREMENT``: writers are serialized, so ids increase in commit order and are never
reused, and a subscriber's cursor is simply the last id it read. A subscriber starts at the
newest id when it subscribes.

Waiting. Each feed has its own connection and watches ``PRAGMA data_version`` (it changes when
another connection commits; it costs microseconds and reads no table), checked after 0.5 ms and
then at intervals doubling up to ``POLL_MAX`` (4 ms): a frame from another process arrives within
a few milliseconds, for a few hundred trivial reads a second while idle. Only when the version
moved is the table read. Measured with ``benchmarks/channel_latency.py`` (2 shared cores, one
message every 10 ms): median 2.3 ms, p99 4.4 to 4.7 ms from publish to receipt.

Retention. A publisher deletes frames older than ``RETENTION`` seconds (by id, from checkpoints it
keeps in memory: no index on time), at most once a second. A subscriber that falls further behind
than that misses frames, and counts them as lost by their sequence numbers. So that it can count
them even when their publisher sends nothing afterwards, every flush also records, per (channel,
publisher), the next number and the id of its last frame (``channel_seq``, kept an hour). A feed
that finds ids missing below the rows it reads (ids are contiguous until pruned) looks up the
publishers it knows whose last frame was among the missing ones, and hands their next numbers to
the subscription as empty frames.

Durability is not the point of a channel: frames are written with ``synchronous=NORMAL`` whatever
the URL asks of the queues.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ..brokers.sqlite import _path_of
from ..errors import BrokerError, ConfigurationError
from . import frame as frames_
from .backend import Frames, matcher

__all__ = ["SQLiteBackend"]

log = logging.getLogger(__name__)

#: Seconds a frame is kept for slow subscribers.
RETENTION = 30.0
POLL_FIRST = 0.0005
POLL_MAX = 0.004
_PRUNE_EVERY = 1.0
_BUSY_TIMEOUT_MS = 30_000
_READ_BATCH = 1024
#: Seconds a publisher's recorded next number is kept after its last frame on a channel.
SEQ_TTL = 3600.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS channel_frames ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT NOT NULL, frame BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS channel_seq ("
    " channel TEXT NOT NULL, publisher TEXT NOT NULL, next INTEGER NOT NULL,"
    " last_id INTEGER NOT NULL, at REAL NOT NULL,"
    " PRIMARY KEY (channel, publisher)) WITHOUT ROWID",
)
_INSERT = "INSERT INTO channel_frames (channel, frame) VALUES (?, ?)"
_MARK = (
    "INSERT INTO channel_seq (channel, publisher, next, last_id, at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (channel, publisher) DO UPDATE SET next = excluded.next, "
    "last_id = excluded.last_id, at = excluded.at"
)
_MARKS_OF = "SELECT next, last_id FROM channel_seq WHERE channel = ? AND publisher = ?"
_READ = "SELECT id, channel, frame FROM channel_frames WHERE id > ? ORDER BY id LIMIT ?"
#: The last id handed out, even when every frame was pruned since.
_NEWEST = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'channel_frames'), 0)"
_PRUNE = "DELETE FROM channel_frames WHERE id <= ?"
_PRUNE_MARKS = "DELETE FROM channel_seq WHERE at < ?"


def _connect(backend: SQLiteBackend) -> sqlite3.Connection:
    try:
        backend.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            backend.path,
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                raise sqlite3.OperationalError("the file cannot be put in WAL mode")
            conn.execute("PRAGMA synchronous = NORMAL")
            for statement in _SCHEMA:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
    except (OSError, sqlite3.Error) as err:
        raise ConfigurationError(
            f"cannot open the SQLite file {str(backend.path)!r} (from {backend.url!r}) for "
            f"channels: {err}; check that the path names a writable file"
        ) from err
    return conn


class _SQLiteFeed:
    def __init__(self, backend: SQLiteBackend, accepts: Callable[[str], bool]) -> None:
        self.reconnects = 0
        self.known: Callable[[], list[tuple[str, str]]] = list
        self._backend = backend
        self._accepts = accepts
        self._conn = _connect(backend)
        self._cursor = self._conn.execute(_NEWEST).fetchone()[0]
        self._version = -1

    def _changed(self) -> bool:
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._version:
            return False
        self._version = version
        return True

    def receive(self, timeout: float) -> list[tuple[str, bytes]]:
        until = time.monotonic() + timeout
        delay = POLL_FIRST
        accepts = self._accepts
        try:
            while True:
                if self._changed():
                    while True:
                        rows = self._conn.execute(_READ, (self._cursor, _READ_BATCH)).fetchall()
                        if not rows:
                            break
                        marks = self._pruned(rows[0][0]) if rows[0][0] > self._cursor + 1 else []
                        self._cursor = rows[-1][0]
                        frames = marks + [(c, f) for _, c, f in rows if accepts(c)]
                        if frames:
                            return frames
                    delay = POLL_FIRST
                left = until - time.monotonic()
                if left <= 0:
                    return []
                time.sleep(min(delay, left))
                delay = min(delay * 2, POLL_MAX)
        except sqlite3.Error as err:
            raise BrokerError(f"SQLite channels {self._backend.url!r}: {err}") from err

    def _pruned(self, first: int) -> list[tuple[str, bytes]]:
        """Ids after the cursor and before ``first`` were pruned unread: empty frames carrying
        the next number of each known publisher whose last frame was among them."""
        log.warning(
            "SQLite channels %r: %d frame(s) were pruned before this subscriber read "
            "them (it is more than %g s behind)",
            self._backend.url,
            first - self._cursor - 1,
            RETENTION,
        )
        marks = []
        for channel, publisher in self.known():
            row = self._conn.execute(_MARKS_OF, (channel, publisher)).fetchone()
            if row is not None and self._cursor < row[1] < first:
                marks.append(
                    (channel, frames_.pack(frames_.publisher_bytes(publisher), row[0], []))
                )
        return marks

    def close(self) -> None:
        self._conn.close()


class SQLiteBackend:
    def __init__(self, url: str) -> None:
        self.url = url
        self.path = _path_of(url)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        #: (time, newest id then): frames at or below an id older than RETENTION may go.
        self._checkpoints: deque[tuple[float, int]] = deque()
        self._last_prune = 0.0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self._pid = os.getpid()  # a forked child never touches its parent's connection
            self._checkpoints.clear()
            self._conn = _connect(self)
        return self._conn

    def publish(self, frames: Frames) -> None:
        with self._lock:
            conn = self._connection()
            now = time.monotonic()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if now - self._last_prune >= _PRUNE_EVERY:
                        self._prune(conn, now)
                    conn.executemany(_INSERT, [(f.channel, f.data) for f in frames])
                    # Ids of one transaction are contiguous: the last is last_insert_rowid().
                    first = conn.execute("SELECT last_insert_rowid()").fetchone()[0] - len(frames)
                    wall = time.time()
                    conn.executemany(
                        _MARK,
                        [
                            (f.channel, f.publisher, f.next_seq, first + i, wall)
                            for i, f in enumerate(frames, 1)
                        ],
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as err:
                raise BrokerError(f"SQLite channels {self.url!r}: {err}") from err

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        self._last_prune = now
        self._checkpoints.append((now, conn.execute(_NEWEST).fetchone()[0]))
        upto = None
        while self._checkpoints and self._checkpoints[0][0] <= now - RETENTION:
            upto = self._checkpoints.popleft()[1]
        if upto is not None:
            conn.execute(_PRUNE, (upto,))
            conn.execute(_PRUNE_MARKS, (time.time() - SEQ_TTL,))

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _SQLiteFeed:
        return _SQLiteFeed(self, matcher(channels, patterns))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
