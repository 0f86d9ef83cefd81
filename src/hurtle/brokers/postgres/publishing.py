"""Writing messages: encoded rows in columns, stored by one statement on whatever cursor is given
(the broker's own connection, or one whose transaction the caller owns), and the unique locks
taken in the same transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ...message import Message, lock_of
from ..common import unique_key_of
from .listener import payloads
from .sql import Sql

if TYPE_CHECKING:
    from .transactions import Statements

#: ``(queue, priority, eta, raw)``: one message to store.
Item = tuple[str, int, float, bytes]


def items_of(messages: Sequence[Message], raws: Sequence[bytes]) -> list[Item]:
    return [(m.queue, m.priority, m.eta, raw) for m, raw in zip(messages, raws, strict=True)]


def store(cur: Statements, sql: Sql, items: Iterable[Item], now: float) -> set[str]:
    """Insert the items, due ones ready and the others delayed, with the queues' names and
    a notification of them, in one statement; returns the queues."""
    queues: list[str] = []
    priorities: list[int] = []
    bodies: list[bytes] = []
    later: tuple[list[str], list[float], list[int], list[bytes]] = ([], [], [], [])
    for queue, priority, eta, raw in items:
        if eta > now:
            later[0].append(queue)
            later[1].append(eta)
            later[2].append(priority)
            later[3].append(raw)
        else:
            queues.append(queue)
            priorities.append(priority)
            bodies.append(raw)
    ready = set(queues)
    names = ready.union(later[0])
    if not names:
        return names
    tail = (*later, sql.ready_channel, payloads(sorted(names)))
    if len(ready) == 1 and len(set(priorities)) == 1:  # each column dumped once, not per row
        cur.execute(sql.STORE_UNIFORM, (list(names), queues[0], priorities[0], bodies, *tail))
    else:
        cur.execute(sql.STORE, (list(names), queues, priorities, bodies, *tail))
    return names


def take_locks(
    cur: Statements,
    sql: Sql,
    messages: Sequence[Message],
    raws: Sequence[bytes],
    unique_for: float,
    keys: Sequence[str] | None = None,
) -> tuple[list[Item], list[str]]:
    """Take the unique lock of each message whose lock is free, in the caller's transaction:
    ``(the items to store, per message the id holding its lock)``. A lock held earlier in the
    batch keeps the later messages out, as one held before it does. ``keys`` are the messages'
    lock keys when the caller has them already (``claim_tick``)."""
    if keys is None:
        keys = [unique_key_of(m) for m in messages]
    cur.execute(sql.SWEEP_UNIQUES)
    items: list[Item] = []
    out: list[str] = []
    for m, key, raw in zip(messages, keys, raws, strict=True):
        lock = lock_of(m)
        until = lock[1] if lock is not None and lock[1] > 0 else 0.0
        row = cur.execute(
            sql.TAKE_UNIQUE, (m.queue, key, m.id, until, until, float(unique_for))
        ).fetchone()
        if row is not None:
            items.append((m.queue, m.priority, m.eta, raw))
            out.append(m.id)
            continue
        holder = cur.execute(sql.UNIQUE_HOLDER, (m.queue, key)).fetchone()
        out.append(holder[0] if holder is not None else m.id)
    return items, out
