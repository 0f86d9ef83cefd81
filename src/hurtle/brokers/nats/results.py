"""Results in KV buckets by ttl: ``hurtle-results-<seconds>`` for each of ``RESULT_CLASSES``.

JetStream 2.9 keeps one age per bucket, not per key: a record goes to the first bucket that
keeps records at least as long as its ttl, with its own expiry in the value, and reads skip a
record past it. A read asks every bucket at once (pipelined) and takes the newest record.
Watchers subscribe to the keys' subjects (``$KV.<bucket>.<key>``) in every bucket: a put is a
message there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from nats.js.errors import NotFoundError

from ...progress import PROGRESS_TTL
from ..records import StoredResult
from . import loop, names
from .store import RESULT_CLASSES, Store, pack, unpack


def bucket(ttl: float) -> str:
    for seconds in RESULT_CLASSES:
        if ttl <= seconds:
            return f"hurtle-results-{seconds}"
    return f"hurtle-results-{RESULT_CLASSES[-1]}"


def _key(id_: str) -> str:
    return "r" + names.token(id_)


async def put(store: Store, records: Sequence[StoredResult]) -> None:
    now = time.time()
    by_bucket: dict[str, list[StoredResult]] = {}
    for r in records:
        by_bucket.setdefault(bucket(r.ttl), []).append(r)
    puts = []
    for name, rs in by_bucket.items():
        kv = await store.kv(name, ttl=float(name.rsplit("-", 1)[1]))
        puts += [kv.put(_key(r.id), pack([now + r.ttl, now, r.payload])) for r in rs]
    await asyncio.gather(*puts)


async def get(store: Store, id_: str) -> bytes | None:
    key = _key(id_)

    async def one(seconds: int) -> Any:
        name = f"hurtle-results-{seconds}"
        try:
            msg = await store.js.get_msg(f"KV_{name}", subject=f"$KV.{name}.{key}")
        except NotFoundError:
            return None
        if not msg.data:
            return None
        return unpack(msg.data)

    found = [f for f in await asyncio.gather(*(one(s) for s in RESULT_CLASSES)) if f]
    now = time.time()
    live = [f for f in found if f[0] > now]
    if not live:
        return None
    return bytes(max(live, key=lambda f: f[1])[2])


def watch(store: Store, ids: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
    async def subscribe() -> list[Any]:
        async def on_msg(_: Any) -> None:
            wake()

        return [await store.nc.subscribe(f"$KV.*.{_key(i)}", cb=on_msg) for i in ids]

    subs = loop.run(subscribe())

    def stop() -> None:
        async def unsubscribe() -> None:
            for sub in subs:
                await sub.unsubscribe()

        with contextlib.suppress(Exception):
            loop.run(unsubscribe(), 10)

    return stop


#: The KV bucket of running tasks' progress reports: one key per message id, each value its
#: own expiry then the report; the bucket keeps a value ``PROGRESS_TTL`` at most.
PROGRESS_BUCKET = "hurtle-progress"


async def put_progress(store: Store, reports: Sequence[StoredResult]) -> None:
    now = time.time()
    kv = await store.kv(PROGRESS_BUCKET, ttl=PROGRESS_TTL)
    await asyncio.gather(
        *(kv.put("p" + names.token(r.id), pack([now + r.ttl, r.payload])) for r in reports)
    )


async def get_progress(store: Store, ids: Sequence[str]) -> list[bytes | None]:
    found = await asyncio.gather(*(store.get("p" + names.token(i), PROGRESS_BUCKET) for i in ids))
    now = time.time()
    return [
        bytes(f[0][1]) if f is not None and isinstance(f[0], list) and f[0][0] > now else None
        for f in found
    ]
