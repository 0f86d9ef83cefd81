"""Workflows on SQLite: ``ack_flow`` in the same transaction as the acknowledgement, and the
chord records it keeps.

Two tables, made on first use (``CREATE TABLE IF NOT EXISTS``: a file made by an older hurtle
gains them without a schema migration): ``chords`` holds per chord its count of distinct
members, whether its callback was published, and when it expires; ``chord_members`` holds one
row per member index with its result. A member counts when its row is new (``INSERT OR
IGNORE``), so a member acknowledged twice counts once, and the counter is one row update: a
chord of N members costs N small writes, batched with the members' acknowledgements, and one
ordered read for its callback.
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Any

from ...message import Message
from ..common import flow_items
from ..records import FlowStep
from .schema import _PUT_RESULT, _clamp

if TYPE_CHECKING:
    from collections.abc import Sequence

_FLOW_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS chords (id TEXT PRIMARY KEY, count INTEGER NOT NULL,"
    " fired INTEGER NOT NULL, expires REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS chords_expires ON chords (expires);"
    "CREATE TABLE IF NOT EXISTS chord_members (chord TEXT NOT NULL, idx INTEGER NOT NULL,"
    " body BLOB NOT NULL, PRIMARY KEY (chord, idx)) WITHOUT ROWID;"
)
_ADD_MEMBER = "INSERT OR IGNORE INTO chord_members (chord, idx, body) VALUES (?, ?, ?)"
_COUNT = (
    "INSERT INTO chords (id, count, fired, expires) VALUES (?, 1, 0, ?) ON CONFLICT (id) DO"
    " UPDATE SET count = count + 1, expires = excluded.expires RETURNING count, fired"
)
_TOUCH = "UPDATE chords SET expires = ? WHERE id = ?"
_FIRE = "UPDATE chords SET fired = 1 WHERE id = ?"
_EXPIRED = "SELECT id FROM chords WHERE expires <= ? LIMIT 100"
_MEMBERS = "SELECT idx, body FROM chord_members WHERE chord = ? ORDER BY idx"
_CHORD = "SELECT expires FROM chords WHERE id = ?"


def _item(m: Message) -> tuple[str, int, float, bytes]:
    return (m.queue, _clamp(m.priority), m.eta, m.encode())


def ensure_schema(broker: Any, conn: sqlite3.Connection) -> None:
    """Make the chord tables once per broker object (in the caller's transaction)."""
    if not getattr(broker, "_chords_ready", False):
        for statement in _FLOW_SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        broker._chords_ready = True


def _forget(conn: sqlite3.Connection, ids: Sequence[str]) -> None:
    conn.executemany("DELETE FROM chord_members WHERE chord = ?", [(i,) for i in ids])
    conn.executemany("DELETE FROM chords WHERE id = ?", [(i,) for i in ids])


def ack_flow(consumer: Any, steps: Sequence[FlowStep]) -> None:
    """``Consumer.ack_flow`` for ``SQLiteConsumer``: every step in one write transaction."""
    encoded = flow_items(steps, _item)
    b = consumer.broker
    new: set[tuple[str, int]] = set()
    with b._write() as conn:
        ensure_schema(b, conn)
        now = time.time()
        expired = [row[0] for row in conn.execute(_EXPIRED, (now,))]
        if expired:
            _forget(conn, expired)
        for step, (items, callback) in zip(steps, encoded, strict=True):
            if not consumer._settle_one(conn, step.delivery):
                continue  # settled already, or recovered: the live copy sets it off
            if step.results:
                conn.executemany(
                    _PUT_RESULT, [(r.id, now + r.ttl, r.payload) for r in step.results]
                )
            chord = step.chord
            if chord is not None:
                expires = now + chord.ttl
                if conn.execute(_ADD_MEMBER, (chord.id, chord.index, chord.payload)).rowcount:
                    count, fired = conn.execute(_COUNT, (chord.id, expires)).fetchone()
                    if not fired and count >= chord.total:
                        conn.execute(_FIRE, (chord.id,))
                        assert callback is not None
                        items = [*items, callback]
                else:
                    conn.execute(_TOUCH, (expires, chord.id))
            if items:
                new |= b._store(conn, items, now)
            if step.forget:
                _forget(conn, [step.forget])
    b._known.update(new)
    b._notify()


def chord_results(broker: Any, id: str, total: int) -> list[bytes] | None:
    """``Broker.chord_results`` for ``SQLiteBroker``: one ordered read."""
    with broker._read() as conn:
        try:
            row = conn.execute(_CHORD, (id,)).fetchone()
        except sqlite3.OperationalError:  # no chord tables yet: no chord either
            return None
        if row is None or row[0] <= time.time():
            return None
        rows = conn.execute(_MEMBERS, (id,)).fetchall()
    if len(rows) < total:
        return None
    return [bytes(body) for _, body in rows[:total]]
