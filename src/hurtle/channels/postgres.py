"""``postgresql://`` channels: ``NOTIFY`` carries the frames, a table carries their counts.

A flush is one transaction on a connection of the backend's own: per frame, it adds the frame's
size to its channel's count (``channel_counts``, a row per channel whose lock orders the
publishers of one channel, so that numbers increase in the order the frames are delivered) and
sends the frame, counted (``frame.count``), with ``pg_notify`` on the schema's channel
``<schema>.channels``; the server delivers the notifications at commit, in commit order. A
frame too large for a notification (about 5.9 KB once base64-encoded) is stored in
``channel_frames`` and its id notified instead; such rows are dropped after ``RETENTION``
seconds, by the publishers, at most once a second.

A feed is a connection of its own, ``LISTEN``ing; it reads every channel's count after its
``LISTEN`` took effect (``start``). Nothing replays what a feed missed: when its connection
drops, it listens again on a new one, counts the reconnection, and hands the subscription a mark
(an empty frame with the count) of each channel it follows or heard from, so that everything
published meanwhile is counted as lost; a frame lost any other way shows as a gap in the numbers
of the next one. A frame committed after the ``LISTEN`` but before the counts were read is both
in those counts and delivered: the feed drops it (its number is below the count it read, the
*floor*), so that each frame is either counted in the start or a mark, or delivered, never both.

Channels use the broker's schema (``?schema=``): the tables are made with the queues'.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ..brokers.postgres.connection import connection_error, parse_url, public_url
from ..brokers.postgres.sql import NOW
from ..errors import BrokerError, DecodeError
from . import frame as frames_
from .backend import Frames, matcher

__all__ = ["PostgresBackend"]

log = logging.getLogger(__name__)

#: Seconds a stored large frame is kept for its subscribers.
RETENTION = 30.0
#: Seconds a channel's count is kept after its last frame (then a new epoch starts).
COUNT_TTL = 3600.0
#: Characters of the longest notification payload sent whole (the server takes 7,999 bytes).
INLINE_MOST = 7900
_PRUNE_EVERY = 1.0

_COUNT = (
    "INSERT INTO {s}.channel_counts AS c (channel, epoch, total, at) "
    "VALUES (%s, %s, %s, {now}) ON CONFLICT (channel) DO UPDATE SET "
    "epoch = CASE WHEN c.at < {now} - %s THEN excluded.epoch ELSE c.epoch END, "
    "total = CASE WHEN c.at < {now} - %s THEN excluded.total ELSE c.total + excluded.total END, "
    "at = excluded.at RETURNING epoch, total - %s"
)
_STORE_FRAME = "INSERT INTO {s}.channel_frames (frame, at) VALUES (%s, {now}) RETURNING id"
_PRUNE = "DELETE FROM {s}.channel_frames WHERE at < {now} - %s"
_COUNTS = "SELECT channel, epoch, total FROM {s}.channel_counts"
_COUNTS_OF = "SELECT channel, epoch, total FROM {s}.channel_counts WHERE channel = ANY(%s)"
_FRAME = "SELECT frame FROM {s}.channel_frames WHERE id = %s"


class _Sql:
    def __init__(self, schema: str) -> None:
        self.channel = f"{schema}.channels"
        q = f'"{schema}"'
        self.count = _COUNT.format(s=q, now=NOW)
        self.store_frame = _STORE_FRAME.format(s=q, now=NOW)
        self.prune = _PRUNE.format(s=q, now=NOW)
        self.counts = _COUNTS.format(s=q)
        self.counts_of = _COUNTS_OF.format(s=q)
        self.frame = _FRAME.format(s=q)


class _PostgresFeed:
    def __init__(self, backend: PostgresBackend, names: Sequence[str], accepts: Any) -> None:
        self.reconnects = 0
        self.known: Callable[[], list[str]] = list
        self._backend = backend
        self._names = list(names)
        self._accepts: Callable[[str], bool] = accepts
        self._conn: psycopg.Connection[Any] | None = None
        self._marks: list[tuple[str, bytes]] = []
        counts = self._listen()
        self.start: dict[str, tuple[int, int]] | None = {
            c: (epoch, total) for c, epoch, total in counts if accepts(c)
        }
        #: channel -> (epoch, count) read after the last ``LISTEN`` and handed over (the start,
        #: or marks), until a frame of that channel numbered past it arrives: frames below it
        #: were committed before the count was read, so they are in it already.
        self._floor: dict[str, tuple[int, int]] = dict(self.start)

    def _listen(self) -> list[tuple[str, int, int]]:
        """A new listening connection; returns every count, read after the ``LISTEN``."""
        b = self._backend
        try:
            conn = psycopg.connect(b._conninfo, autocommit=True)
        except psycopg.Error as err:
            raise connection_error(b.url, err, "opening a channel feed") from err
        try:
            conn.execute(f'LISTEN "{b._sql.channel}"')
            rows = conn.execute(b._sql.counts).fetchall()
        except psycopg.Error as err:
            conn.close()
            raise connection_error(b.url, err, "opening a channel feed") from err
        self._conn = conn
        return [(r[0], int(r[1]), int(r[2])) for r in rows]

    def _reconnect(self, err: Exception) -> None:
        """Listen again; mark what may have been missed meanwhile."""
        log.warning(
            "PostgreSQL channels at %s: lost the feed's connection (%s); listening again, "
            "what was published meanwhile is counted as lost",
            self._backend.url,
            " ".join(str(err).split()),
        )
        self._drop()
        self.reconnects += 1
        counts = self._listen()
        wanted = set(self._names).union(self.known())
        marked = [(c, epoch, total) for c, epoch, total in counts if c in wanted]
        self._marks = [(c, frames_.MARK + frames_.count(e, t)) for c, e, t in marked]
        self._floor = {c: (e, t) for c, e, t in marked}

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def receive(self, timeout: float) -> list[tuple[str, bytes]]:
        until = time.monotonic() + timeout
        while True:
            if self._marks:
                marks, self._marks = self._marks, []
                return marks
            try:
                if self._conn is None:
                    self._reconnect(ConnectionError("not connected"))
                    continue
                out = self._read(max(until - time.monotonic(), 0.0))
            except BrokerError:
                if time.monotonic() >= until:
                    return []
                time.sleep(0.1)
                continue
            except psycopg.Error as err:
                try:
                    self._reconnect(err)
                except BrokerError:
                    self._drop()
                continue
            if out or time.monotonic() >= until:
                return out

    def _read(self, timeout: float) -> list[tuple[str, bytes]]:
        conn = self._conn
        assert conn is not None
        notes = list(conn.notifies(timeout=timeout, stop_after=1))
        if notes:
            notes += conn.notifies(timeout=0)
        out = []
        accepts, floor = self._accepts, self._floor
        for note in notes:
            channel, _, data = note.payload.partition("\n")
            if not accepts(channel):
                continue
            if data.startswith("#"):
                row = conn.execute(self._backend._sql.frame, (int(data[1:]),)).fetchone()
                if row is None:  # pruned before it was read: the next frame shows the gap
                    continue
                raw = bytes(row[0])
            else:
                raw = base64.b64decode(data)
            if floor and channel in floor and self._counted(channel, raw):
                continue
            out.append((channel, raw))
        return out

    def _counted(self, channel: str, raw: bytes) -> bool:
        """Whether the frame ``raw`` of ``channel`` is in the count read after the ``LISTEN``
        (committed before that read); the first frame that is not ends the channel's floor,
        since the frames after it were committed after it."""
        epoch, total = self._floor[channel]
        try:
            *_, frame_epoch, number = frames_.decode(raw)
        except DecodeError:  # the subscription says what it is
            frame_epoch, number = epoch, total
        if frame_epoch == epoch and number < total:
            return True
        del self._floor[channel]
        return False

    def close(self) -> None:
        self._drop()


class PostgresBackend:
    def __init__(self, url: str) -> None:
        self.url = public_url(url)
        self._conninfo, schema = parse_url(url)
        self._sql = _Sql(schema)
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = os.getpid()
        self._last_prune = 0.0
        from ..brokers.postgres.connection import prepare_schema

        try:  # the tables live with the queues': made the same way, on first use
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                prepare_schema(conn, schema, self.url, create=True)
        except psycopg.Error as err:
            raise connection_error(self.url, err, "opening channels") from err

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._pid != os.getpid():
            self._pid = os.getpid()  # a forked child never touches its parent's connection
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
        return self._conn

    def publish(self, frames: Frames) -> None:
        sql = self._sql
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    now = time.monotonic()
                    if now - self._last_prune >= _PRUNE_EVERY:
                        self._last_prune = now
                        conn.execute(sql.prune, (RETENTION,))
                    epoch = time.time_ns() // 1000
                    for f in frames:
                        row = conn.execute(
                            sql.count, (f.channel, epoch, f.size, COUNT_TTL, COUNT_TTL, f.size)
                        ).fetchone()
                        assert row is not None
                        data = f.data + frames_.count(int(row[0]), int(row[1]))
                        text = base64.b64encode(data).decode("ascii")
                        if len(text) + len(f.channel) + 1 > INLINE_MOST:
                            stored = conn.execute(sql.store_frame, (data,)).fetchone()
                            assert stored is not None
                            text = f"#{stored[0]}"
                        conn.execute(
                            "SELECT pg_notify(%s, %s)", (sql.channel, f"{f.channel}\n{text}")
                        )
            except psycopg.Error as err:
                if self._conn is not None and self._conn.closed:
                    self._conn = None
                raise connection_error(self.url, err, "publishing to channels") from err

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _PostgresFeed:
        return _PostgresFeed(self, channels, matcher(channels, patterns))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
