"""Control on NATS: paused queues, cancelled message ids and forgotten queues.

One record in the state bucket, ``control``, says what every fetch must know: the paused queues
and, per cancellation bucket, until when a cancellation stored there is live. A fetch reads it
once (beside the levels it pulls, so it costs no extra wait) and skips the paused queues; its
``cancellations`` flag is whether any of those times is still ahead. Another client's pause or
cancel is thus seen by the next fetch, with one KV read per fetch, none per message.

Cancelled ids are keys of the buckets ``hurtle-cancel-<seconds>`` (the ages of
``RESULT_CLASSES``: JetStream 2.9 keeps one age per bucket), each in the first bucket that keeps
it as long as its ttl, with its own expiry as the value; ``cancelled`` reads only the buckets
the record says are live, every id at once (pipelined).

A forgotten queue keeps its stream (a publisher or consumer may hold it); the record
``forgotten`` maps its name to the stream's last sequence at the time. ``queues()`` leaves out a
stream whose last sequence is still that one, so any message published since makes the queue
known again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from nats.js.errors import KeyNotFoundError, NotFoundError

from . import names
from .store import RESULT_CLASSES, Store, pack, unpack

CONTROL_KEY = "control"
FORGOTTEN_KEY = "forgotten"


def cancel_class(ttl: float) -> int:
    """The age of the cancellation bucket that keeps an id ``ttl`` seconds."""
    for seconds in RESULT_CLASSES:
        if ttl <= seconds:
            return seconds
    return RESULT_CLASSES[-1]


def cancel_bucket(seconds: int) -> str:
    return f"hurtle-cancel-{seconds}"


async def read(store: Store) -> tuple[set[str], dict[int, float]]:
    """``(paused queues, {cancel bucket age: live until})``."""
    found = await store.get(CONTROL_KEY)
    if found is None:
        return set(), {}
    value = found[0]
    return set(value.get("paused", ())), {int(k): v for k, v in value.get("cancel", {}).items()}


def live(cancel: dict[int, float], now: float) -> bool:
    """True while some cancellation is live."""
    return any(until > now for until in cancel.values())


async def set_paused(store: Store, queue: str, paused: bool) -> None:
    def change(old: Any) -> tuple[Any, None]:
        value = dict(old or {})
        queues = set(value.get("paused", ()))
        if paused:
            queues.add(queue)
        else:
            queues.discard(queue)
        value["paused"] = sorted(queues)
        return value, None

    await store.cas(CONTROL_KEY, change)
    if not paused:
        await store.wake([queue])


async def cancel(store: Store, ids: Sequence[str], ttl: float) -> None:
    """Store the ids first, then say their bucket is live until their expiry: a fetch that sees
    the flag finds them."""
    seconds = cancel_class(ttl)
    kv = await store.kv(cancel_bucket(seconds), ttl=float(seconds))
    until = time.time() + ttl
    await asyncio.gather(*(kv.put(names.token(str(i)), pack(until)) for i in ids))

    def change(old: Any) -> tuple[Any, None]:
        value = dict(old or {})
        now = time.time()
        times = {k: v for k, v in value.get("cancel", {}).items() if v > now}
        times[str(seconds)] = max(times.get(str(seconds), 0.0), until)
        value["cancel"] = times
        return value, None

    await store.cas(CONTROL_KEY, change)


async def cancelled(store: Store, ids: Sequence[str]) -> set[str]:
    _, times = await read(store)
    now = time.time()
    buckets = [cancel_bucket(s) for s, until in times.items() if until > now]
    if not buckets or not ids:
        return set()

    async def one(bucket: str, id_: str) -> str | None:
        try:
            msg = await store.js.get_msg(f"KV_{bucket}", subject=f"$KV.{bucket}.{names.token(id_)}")
        except NotFoundError:
            return None
        if not msg.data or unpack(msg.data) <= now:
            return None
        return id_

    found = await asyncio.gather(*(one(b, i) for b in buckets for i in ids))
    return {i for i in found if i is not None}


async def uncancel(store: Store, ids: Sequence[str]) -> None:
    _, times = await read(store)
    now = time.time()
    for seconds, until in times.items():
        if until <= now:
            continue
        kv = await store.kv(cancel_bucket(seconds), ttl=float(seconds))

        async def drop(kv: Any, key: str) -> None:
            with contextlib.suppress(KeyNotFoundError, NotFoundError):
                await kv.purge(key)

        await asyncio.gather(*(drop(kv, names.token(str(i))) for i in ids))


async def forgotten(store: Store) -> dict[str, int]:
    """Forgotten queues, each with the last sequence of its stream when it was forgotten."""
    found = await store.get(FORGOTTEN_KEY)
    return {} if found is None else dict(found[0])


async def forget(store: Store, queue: str, last_seq: int) -> None:
    def change(old: Any) -> tuple[Any, None]:
        return {**(old or {}), queue: last_seq}, None

    await store.cas(FORGOTTEN_KEY, change)
