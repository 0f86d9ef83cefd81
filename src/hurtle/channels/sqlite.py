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

Counts. Each channel's count is a row of ``channel_counts (channel, epoch, total, last_id,
at)``: a flush reads the counts of its channels, appends each frame's number to it
(``frame.count``) and writes the counts back with the id of each channel's last frame, in the
same transaction as the frames (ids and numbers so increase together). A count unused for an hour
(``COUNT_TTL``) is deleted; the next frame starts a new one, with a new epoch. A feed reads the
newest id and every count in one snapshot when it opens (``start``).

Retention. A publisher deletes frames older than ``RETENTION`` seconds (by id, from checkpoints it
keeps in memory: no index on time), at most once a second. A subscriber that falls further behind
than that misses frames. Ids are contiguous until pruned, so a feed that finds ids missing
between its cursor and the rows it reads knows it missed some: the counts of the channels it
follows whose last frame was among the missing ones are handed to the subscription as empty
frames (marks), and the channels that have frames left show the gap with their next frame.
Either way the subscription counts every message missed, whoever published it.

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
from ..brokers.sqlite.connection import connect_wal, immediate
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
_READ_BATCH = 1024
#: Seconds a channel's count is kept after its last frame.
COUNT_TTL = 3600.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS channel_frames ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT NOT NULL, frame BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS channel_counts ("
    " channel TEXT PRIMARY KEY, epoch INTEGER NOT NULL, total INTEGER NOT NULL,"
    " last_id INTEGER NOT NULL, at REAL NOT NULL) WITHOUT ROWID",
)
_INSERT = "INSERT INTO channel_frames (channel, frame) VALUES (?, ?)"
_COUNT_OF = "SELECT epoch, total FROM channel_counts WHERE channel = ?"
_SET_COUNT = (
    "INSERT INTO channel_counts (channel, epoch, total, last_id, at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (channel) DO UPDATE SET epoch = excluded.epoch, total = excluded.total, "
    "last_id = excluded.last_id, at = excluded.at"
)
_COUNTS = "SELECT channel, epoch, total FROM channel_counts"
_COUNTS_LAST_BETWEEN = (
    "SELECT channel, epoch, total FROM channel_counts WHERE last_id > ? AND last_id < ?"
)
_READ = "SELECT id, channel, frame FROM channel_frames WHERE id > ? ORDER BY id LIMIT ?"
#: The last id handed out, even when every frame was pruned since.
_NEWEST = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'channel_frames'), 0)"
_PRUNE = "DELETE FROM channel_frames WHERE id <= ?"
_PRUNE_COUNTS = "DELETE FROM channel_counts WHERE at < ?"


def _create_tables(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)


def _connect(backend: SQLiteBackend) -> sqlite3.Connection:
    try:
        backend.path.parent.mkdir(parents=True, exist_ok=True)
        conn = connect_wal(backend.path, "normal", _create_tables)
    except (OSError, sqlite3.Error) as err:
        raise ConfigurationError(
            f"cannot open the SQLite file {str(backend.path)!r} (from {backend.url!r}) for "
            f"channels: {err}; check that the path names a writable file"
        ) from err
    return conn


class _SQLiteFeed:
    def __init__(self, backend: SQLiteBackend, accepts: Callable[[str], bool]) -> None:
        self.reconnects = 0
        self.known: Callable[[], list[str]] = list
        self._backend = backend
        self._accepts = accepts
        self._conn = _connect(backend)
        self._version = -1
        try:
            self._conn.execute("BEGIN")  # one snapshot: the counts are those at the cursor
            try:
                self._cursor = self._conn.execute(_NEWEST).fetchone()[0]
                counts = self._conn.execute(_COUNTS).fetchall()
            finally:
                self._conn.execute("COMMIT")
        except sqlite3.Error as err:
            self._conn.close()
            raise BrokerError(f"SQLite channels {backend.url!r}: {err}") from err
        self.start: dict[str, tuple[int, int]] | None = {
            c: (epoch, total) for c, epoch, total in counts if accepts(c)
        }

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
        """Ids after the cursor and before ``first`` were pruned unread: marks with the count of
        each channel of this feed whose last frame was among them (the others have a frame left,
        which shows the gap)."""
        log.warning(
            "SQLite channels %r: %d frame(s) were pruned before this subscriber read "
            "them (it is more than %g s behind); the messages it missed are counted as lost",
            self._backend.url,
            first - self._cursor - 1,
            RETENTION,
        )
        rows = self._conn.execute(_COUNTS_LAST_BETWEEN, (self._cursor, first)).fetchall()
        return [
            (channel, frames_.MARK + frames_.count(epoch, total))
            for channel, epoch, total in rows
            if self._accepts(channel)
        ]

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
            with immediate(conn, "SQLite channels", self.url):
                if now - self._last_prune >= _PRUNE_EVERY:
                    self._prune(conn, now)
                counts: dict[str, tuple[int, int]] = {}
                rows = []
                for f in frames:
                    epoch, total = counts.get(f.channel) or self._count_of(conn, f.channel)
                    rows.append((f.channel, f.data + frames_.count(epoch, total)))
                    counts[f.channel] = (epoch, total + f.size)
                conn.executemany(_INSERT, rows)
                # Ids of one transaction are contiguous: the last is last_insert_rowid().
                first = conn.execute("SELECT last_insert_rowid()").fetchone()[0] - len(rows)
                last_ids = {c: first + i for i, (c, _) in enumerate(rows, 1)}
                wall = time.time()
                conn.executemany(
                    _SET_COUNT,
                    [(c, e, n, last_ids[c], wall) for c, (e, n) in counts.items()],
                )

    @staticmethod
    def _count_of(conn: sqlite3.Connection, channel: str) -> tuple[int, int]:
        row = conn.execute(_COUNT_OF, (channel,)).fetchone()
        return (row[0], row[1]) if row is not None else (time.time_ns() // 1000, 0)

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        self._last_prune = now
        self._checkpoints.append((now, conn.execute(_NEWEST).fetchone()[0]))
        upto = None
        while self._checkpoints and self._checkpoints[0][0] <= now - RETENTION:
            upto = self._checkpoints.popleft()[1]
        if upto is not None:
            conn.execute(_PRUNE, (upto,))
            conn.execute(_PRUNE_COUNTS, (time.time() - COUNT_TTL,))

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _SQLiteFeed:
        return _SQLiteFeed(self, matcher(channels, patterns))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
