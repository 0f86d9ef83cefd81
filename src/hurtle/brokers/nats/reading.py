"""What the NATS broker reads of its queues: their names, their counts, their soonest delayed
messages, and whether one is empty enough to forget."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.js.errors import NotFoundError

from ..records import QueueStats
from . import control, names
from .deadletters import DeadLetters
from .store import Store

#: Most delayed messages of a queue ``next_delayed`` reads (one server round trip each).
NEXT_DELAYED_SCAN = 10_000


async def queue_names(store: Store) -> list[str]:
    """``Broker.queues``: the queues that had messages, and some since they were forgotten."""
    out = []
    gone = await control.forgotten(store)
    async for info in _streams(store):
        # a stream is made for a consumer too: a queue is one that had messages, and
        # some since it was forgotten
        if info.config.name.startswith("HQ_") and info.state.last_seq:
            name = names.untoken(info.config.name[3:])
            if gone.get(name) != info.state.last_seq:
                out.append(name)
    paused, _ = await control.read(store)  # a paused queue is known, as elsewhere
    return sorted({*out, *paused})


async def forget(store: Store, dead: DeadLetters, queue: str) -> bool:
    """``Broker.forget``: forget ``queue`` if nothing is in it."""
    # the stream's last sequence first: a message published after it is read shows then
    try:
        info = await store.js.stream_info(names.stream(queue))
    except NotFoundError:
        return QueueStats() == (await stats(store, dead, [queue]))[queue]  # never had messages
    if (await stats(store, dead, [queue]))[queue] != QueueStats():
        return False
    await control.forget(store, queue, info.state.last_seq)
    return True


async def _streams(store: Store) -> AsyncIterator[Any]:
    offset = 0
    while True:
        infos = await store.js.streams_info(offset)
        if not infos:
            return
        for info in infos:
            yield info
        offset += len(infos)
        if len(infos) < 256:
            return


async def stats(store: Store, dead: DeadLetters, queues: list[str]) -> dict[str, QueueStats]:
    """``Broker.stats`` of ``queues``."""
    (paused, _), found = await asyncio.gather(
        control.read(store), asyncio.gather(*(_stats_of(store, dead, q) for q in queues))
    )
    return {
        q: msgspec.structs.replace(s, paused=True) if q in paused else s
        for q, s in zip(queues, found, strict=True)
    }


async def _stats_of(store: Store, dead: DeadLetters, queue: str) -> QueueStats:
    js = store.js
    stream = names.stream(queue)
    dead_count = await dead.count(queue)
    try:
        info = await js.stream_info(stream, subjects_filter=f"hq.{names.token(queue)}.*")
    except NotFoundError:
        return QueueStats(dead=dead_count)
    infos = await asyncio.gather(
        *(js.consumer_info(stream, names.durable(level)) for level in names.LEVELS)
    )
    delayed = (info.state.subjects or {}).get(names.subject(queue, names.DELAYED), 0)
    return QueueStats(
        ready=sum(i.num_pending or 0 for i in infos),
        delayed=int(delayed),
        in_flight=sum(i.num_ack_pending or 0 for i in infos),
        dead=dead_count,
    )


async def next_delayed(store: Store, queue: str, limit: int) -> list[tuple[float, bytes]]:
    """Reads the queue's delayed subject in stream order (JetStream 2.9 keeps no order by
    eta), at most ``NEXT_DELAYED_SCAN`` messages: past that, the soonest of those."""
    js = store.js
    stream = names.stream(queue)
    subject = names.subject(queue, names.DELAYED)
    latest: list[tuple[float, int, bytes]] = []  # the soonest so far, latest on top
    seq = 1
    for _ in range(NEXT_DELAYED_SCAN):
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            break
        seq = msg.seq + 1
        eta = float((msg.headers or {}).get(names.ETA, "0"))
        item = (-eta, -msg.seq, bytes(msg.data or b""))
        if len(latest) < limit:
            heapq.heappush(latest, item)
        elif item > latest[0]:
            heapq.heapreplace(latest, item)
    return [(-eta, raw) for eta, _, raw in sorted(latest, reverse=True)]
