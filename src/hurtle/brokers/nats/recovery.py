"""What dead workers held goes back: to its queue, to quarantine, or to the dead letters.

Each consumer keeps a record in the bucket ``hurtle-workers`` (by worker id): its deadline and
the ack subjects of what it holds, written with each fetch and each beat. A recoverer deletes
the record of a worker past its deadline with a compare-and-set on its revision (one recoverer
wins), then,
for each delivery still in its stream (an acknowledged one is gone from a work-queue stream),
republishes the bytes with one more death in ``Hurtle-Deaths`` and terminates the old delivery:
a late acknowledgement from the dead worker then settles nothing.

Poison messages are handled as on the other brokers: a message recovered a second time goes to
the quarantine subject, whose consumer lets one out at a time (``MaxAckPending`` 1); one whose
worker dies holding it alone, or holding no other message let out that way, becomes a dead
letter past ``max_recoveries`` deaths (``write_dead``: the broker's ``write_lost``, which ends
what waits on it). JetStream's own redeliveries (``AckWait``, the backstop for a worker
that died before its record named what it took) count as deaths too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from ..common import lost_reason
from . import names
from .store import WORKERS_BUCKET, Store

#: Writes dead letters of one queue: ``(queue, [(raw, reason)])``.
WriteDead = Callable[[str, list[tuple[bytes, str]]], Awaitable[None]]


async def recover_dead_workers(store: Store, max_recoveries: int, write_dead: WriteDead) -> int:
    now = time.time()
    keys = await store.keys(WORKERS_BUCKET)
    found = await asyncio.gather(*(store.get(k, WORKERS_BUCKET) for k in keys))
    kv = await store.kv(WORKERS_BUCKET)
    moved = 0
    for key, entry in zip(keys, found, strict=True):
        if entry is None:
            continue
        record, rev = entry
        if record["deadline"] >= now:
            continue
        try:
            await kv.delete(key, last=rev)
        except KeyWrongLastSequenceError:
            continue  # another recoverer won, or the worker beat meanwhile
        moved += await recover_held(store, record["held"], max_recoveries, write_dead)
    return moved


def _level(consumer: str) -> str:
    return consumer[1:] if consumer.startswith("p") else consumer


async def recover_held(
    store: Store, replies: list[str], max_recoveries: int, write_dead: WriteDead
) -> int:
    parsed = [(reply, *names.parse_reply(reply)) for reply in replies]

    async def stored(stream: str, seq: int) -> Any:
        try:
            return await store.js.get_msg(stream, seq=seq)
        except NotFoundError:
            return None

    msgs = await asyncio.gather(*(stored(stream, seq) for _, stream, _, _, seq in parsed))
    alive = [(p, m) for p, m in zip(parsed, msgs, strict=True) if m is not None]
    lone = sum(_level(p[2]) == names.QUARANTINE for p, _ in alive) == 1
    alone = len(alive) == 1  # the only message its worker held: the only suspect
    publish: list[tuple[str, bytes, dict[str, str] | None]] = []
    dead: dict[str, list[tuple[bytes, str]]] = {}
    queues: list[str] = []
    for (_reply, stream, consumer, delivered, seq), msg in alive:
        queue = names.untoken(stream[3:])
        level = _level(consumer)
        headers = msg.headers or {}
        deaths = int(headers.get(names.DEATHS, "0")) + delivered
        priority = headers.get(names.PRIORITY, level)
        raw = bytes(msg.data or b"")
        if (alone or (level == names.QUARANTINE and lone)) and deaths > max_recoveries:
            dead.setdefault(queue, []).append((raw, lost_reason(deaths, max_recoveries)))
            continue
        target = names.QUARANTINE if deaths >= 2 else priority
        out = {
            names.DEATHS: str(deaths),
            names.PRIORITY: priority,
            names.MSG_ID: f"r.{stream}.{seq}",
        }
        publish.append((names.subject(queue, target), raw, out))
        store.note(queue, target)
        queues.append(queue)
    await store.publish_all(publish)
    for queue, items in dead.items():
        await write_dead(queue, items)
    await store.settle([p[0] for p, _ in alive], b"+TERM")
    await store.wake(queues)
    return len(alive)
