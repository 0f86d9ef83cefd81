"""Workflows on NATS: ``ack_flow`` as ordered, idempotent steps, and the chord records.

JetStream has no transaction over several subjects and buckets, so a batch of steps is applied
in an order where each part can be done again without effect, and a worker killed at any point
neither loses what a step sets off nor sets it off twice:

1. the worker's record is written (a compare-and-set on its revision): if a recoverer took it,
   what it held went back, and the steps of those deliveries are skipped — the copies
   delivered again apply their own;
2. results and the chord members' payloads are stored (puts: again is the same);
3. each chord's count is updated, once per chord per batch: a compare-and-set of its record,
   a bitmap of the member indexes counted (a member counted twice counts once). The update
   that makes ``total`` indexes records which member completed the chord (``by``);
4. the next links and the callbacks of completed chords are published under their message ids
   as ``Nats-Msg-Id``: JetStream stores a message once per id within the stream's duplicate
   window (two minutes);
5. the deliveries are acknowledged, and then the chord records named by ``forget`` are purged
   (a worker killed between the two leaves a record that expires with its ttl; purged first, a
   callback delivered again would find its chord's results gone).

A worker killed after step 3 and before step 5 leaves its deliveries to be delivered again:
their steps find their indexes counted, and the member that completed the chord publishes the
callback again, which JetStream drops as a duplicate — provided that copy comes back within
the duplicate window (recovery takes the heartbeat timeout, 20 s by default). Past it, the link
or callback would run twice: at-least-once, like any message.

A chord lives in the bucket ``hurtle-chords-<seconds>`` that keeps records at least twice as long
as the step's ttl (the next of ``RESULT_CLASSES``): ``<chord>.n`` is the count record (its expiry
``ttl`` seconds after its last change, the total, the bitmap, the count, ``by``) and
``<chord>.m.<index>`` each member's payload, read by ``chord_results`` all at once (pipelined).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nats.js.errors import NotFoundError

from ...message import Message
from ..records import ChordStep, FlowStep
from . import names, results
from .store import RESULT_CLASSES, Store, unpack

if TYPE_CHECKING:
    from .consumer import NatsConsumer

Item = tuple[str, bytes, dict[str, str] | None]


def chord_bucket(ttl: float) -> tuple[str, int]:
    """The bucket of a chord whose record lives ``ttl`` seconds, and its age: a class above the
    one that fits, so that the first members' payloads outlive the record's last change."""
    fits = next((i for i, s in enumerate(RESULT_CLASSES) if ttl <= s), len(RESULT_CLASSES) - 1)
    seconds = RESULT_CLASSES[min(fits + 1, len(RESULT_CLASSES) - 1)]
    return f"hurtle-chords-{seconds}", seconds


def _count_key(chord: str) -> str:
    return f"{names.token(chord)}.n"


def _member_key(chord: str, index: int) -> str:
    return f"{names.token(chord)}.m.{index}"


async def ack_flow(
    consumer: NatsConsumer, steps: Sequence[FlowStep], payloads: dict[str, bytes]
) -> None:
    """``Consumer.ack_flow``; ``payloads`` holds the encoded messages to publish, by id."""
    store = consumer.store
    broker = consumer.broker
    await consumer._write_record([])  # a recoverer took what we held: those steps are skipped
    with consumer._lock:
        live = [s for s in steps if s.delivery.receipt in consumer._held]
    if not live:
        return
    stored = [r for s in live for r in s.results]
    members = [s.chord for s in live if s.chord is not None]
    await asyncio.gather(results.put(store, stored), _put_members(store, members))
    callbacks = await _count(store, members)
    out = [m for s in live for m in s.publish] + callbacks
    if out:
        items = broker._items(out, [payloads[m.id] for m in out])
        for m, (_, _, headers) in zip(out, items, strict=True):
            assert headers is not None
            headers[names.MSG_ID] = f"flow.{m.id}"
        await broker._publish([m.queue for m in out], items)
    taken = consumer._take_held([s.delivery for s in live])
    await store.settle([reply for reply, _ in taken], b"+ACK")
    forget = {s.forget for s in live if s.forget}
    await asyncio.gather(*(_forget(store, chord) for chord in forget))


async def _put_members(store: Store, members: list[ChordStep]) -> None:
    puts = []
    for step in members:
        bucket, seconds = chord_bucket(step.ttl)
        kv = await store.kv(bucket, ttl=float(seconds))
        puts.append(kv.put(_member_key(step.id, step.index), step.payload))
    await asyncio.gather(*puts)


async def _count(store: Store, members: list[ChordStep]) -> list[Message]:
    """Count the members of each chord in one compare-and-set; the callbacks to publish."""
    by_chord: dict[str, list[ChordStep]] = {}
    for step in members:
        by_chord.setdefault(step.id, []).append(step)

    async def one(group: list[ChordStep]) -> Message | None:
        first = group[0]
        bucket, seconds = chord_bucket(first.ttl)
        await store.kv(bucket, ttl=float(seconds))  # made with its age before the first write
        indexes = {s.index for s in group}

        def change(old: Any) -> tuple[Any, bool]:
            now = time.time()
            if old is None or old[0] <= now:
                total, bits, count, by = first.total, bytearray((first.total + 7) // 8), 0, -1
            else:
                _, total, raw, count, by = old
                bits = bytearray(raw)
            for i in indexes:
                if 0 <= i < total and not bits[i >> 3] & (1 << (i & 7)):
                    bits[i >> 3] |= 1 << (i & 7)
                    count += 1
            fire = False
            if by < 0 and count >= total:
                by, fire = min(indexes), True
            elif by >= 0 and by in indexes:
                fire = True  # the completing member again (its worker died before its ack)
            return [now + first.ttl, total, bytes(bits), count, by], fire

        fire = await store.cas(_count_key(first.id), change, bucket)
        return first.callback if fire else None

    found = await asyncio.gather(*(one(g) for g in by_chord.values()))
    return [m for m in found if m is not None]


async def _forget(store: Store, chord: str) -> None:
    """Purge the chord's record and payloads, in whichever bucket holds them."""

    async def one(seconds: int) -> None:
        bucket = f"hurtle-chords-{seconds}"
        with contextlib.suppress(NotFoundError):
            await store.js.purge_stream(
                f"KV_{bucket}", subject=f"$KV.{bucket}.{names.token(chord)}.>"
            )

    await asyncio.gather(*(one(s) for s in RESULT_CLASSES[1:]))


async def _get(store: Store, bucket: str, key: str) -> bytes | None:
    try:
        msg = await store.js.get_msg(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")
    except NotFoundError:
        return None
    return bytes(msg.data) if msg.data else None


async def chord_results(store: Store, chord: str, total: int) -> list[bytes] | None:
    if total <= 0:
        return []
    buckets = [f"hurtle-chords-{s}" for s in RESULT_CLASSES[1:]]
    records = await asyncio.gather(*(_get(store, b, _count_key(chord)) for b in buckets))
    now = time.time()
    live = [
        (value, bucket)
        for raw, bucket in zip(records, buckets, strict=True)
        if raw is not None and (value := unpack(raw))[0] > now
    ]
    if not live:
        return None
    value, bucket = max(live, key=lambda found: found[0][0])
    if value[3] < total:
        return None
    payloads = await asyncio.gather(
        *(_get(store, bucket, _member_key(chord, i)) for i in range(total))
    )
    if any(p is None for p in payloads):
        return None
    return [p for p in payloads if p is not None]
