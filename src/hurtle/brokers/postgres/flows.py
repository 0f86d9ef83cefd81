"""Workflows on PostgreSQL: ``ack_flow`` in the same transaction as the acknowledgement, and the
chord records it keeps.

``chords`` holds per chord its count of distinct members, whether its callback was published,
and when it expires; ``chord_members`` one row per member index with its result. A member
counts when its row is new (``ON CONFLICT DO NOTHING``), so a member acknowledged twice counts
once; the count is one row update, whose row lock orders the members of one chord, so exactly
one of them sees the count complete and publishes the callback.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from ...message import Message
from ..common import flow_items
from ..records import FlowStep
from .publishing import Item, store

if TYPE_CHECKING:
    from .broker import PostgresBroker
    from .consumer import PostgresConsumer

_ADD_MEMBER = (
    "INSERT INTO {s}.chord_members (chord, idx, body) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
)
_COUNT = (
    "INSERT INTO {s}.chords AS c (id, count, fired, expires) VALUES (%s, 1, false, {now} + %s) "
    "ON CONFLICT (id) DO UPDATE SET count = c.count + 1, expires = excluded.expires "
    "RETURNING count, fired"
)
_TOUCH = "UPDATE {s}.chords SET expires = {now} + %s WHERE id = %s"
_FIRE = "UPDATE {s}.chords SET fired = true WHERE id = %s"
_EXPIRED = "SELECT id FROM {s}.chords WHERE expires <= {now} LIMIT 100"
_FORGET_MEMBERS = "DELETE FROM {s}.chord_members WHERE chord = ANY(%s)"
_FORGET = "DELETE FROM {s}.chords WHERE id = ANY(%s)"
_CHORD = "SELECT expires > {now} FROM {s}.chords WHERE id = %s"
_MEMBERS = "SELECT body FROM {s}.chord_members WHERE chord = %s ORDER BY idx LIMIT %s"


def _item(m: Message) -> Item:
    return (m.queue, m.priority, m.eta, m.encode())


def ack_flow(consumer: PostgresConsumer, steps: Sequence[FlowStep]) -> None:
    """``Consumer.ack_flow``: every step in one transaction."""
    encoded = flow_items(steps, _item)
    b = consumer.broker
    q = b._sql.format

    def run(cur: psycopg.Cursor[Any]) -> None:
        expired = [row[0] for row in cur.execute(q(_EXPIRED)).fetchall()]
        if expired:
            cur.execute(q(_FORGET_MEMBERS), (expired,))
            cur.execute(q(_FORGET), (expired,))
        held = consumer._settled(cur, [step.delivery for step in steps])
        out: list[Item] = []
        for step, (items, callback) in zip(steps, encoded, strict=True):
            if step.delivery.receipt not in held:
                continue  # settled already, or recovered: the live copy sets it off
            if step.results:
                b._put_results(cur, step.results)
            chord = step.chord
            if chord is not None:
                cur.execute(q(_ADD_MEMBER), (chord.id, chord.index, chord.payload))
                if cur.rowcount:
                    row = cur.execute(q(_COUNT), (chord.id, chord.ttl)).fetchone()
                    assert row is not None
                    count, fired = row
                    if not fired and count >= chord.total:
                        cur.execute(q(_FIRE), (chord.id,))
                        assert callback is not None
                        items = [*items, callback]
                else:
                    cur.execute(q(_TOUCH), (chord.ttl, chord.id))
            out += items
            if step.forget:
                cur.execute(q(_FORGET_MEMBERS), ([step.forget],))
                cur.execute(q(_FORGET), ([step.forget],))
        store(cur, b._sql, out, time.time())

    b._run(f"settling {len(steps)} workflow steps", run)
    consumer._let_go([step.delivery for step in steps])


def chord_results(broker: PostgresBroker, id: str, total: int) -> list[bytes] | None:
    """``Broker.chord_results``: one ordered read."""
    q = broker._sql.format

    def run(cur: psycopg.Cursor[Any]) -> list[bytes] | None:
        row = cur.execute(q(_CHORD), (id,)).fetchone()
        if row is None or not row[0]:
            return None
        rows = cur.execute(q(_MEMBERS), (id, total)).fetchall()
        return [bytes(r[0]) for r in rows]

    bodies = broker._run("reading a chord's results", run)
    if bodies is None or len(bodies) < total:
        return None
    return bodies
