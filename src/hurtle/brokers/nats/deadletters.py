"""Dead letters: a limits stream per queue (``HD_<queue>``), its messages the raw bytes with the
reason and the time in headers; a dead letter's id is its sequence in that stream.

The cap (``dead_letter_max``) is the stream's ``max_msgs`` (the server drops the oldest) and the
ttl its ``max_age``; a write also drops, before it, the dead letters past the ttl and counts
what either limit dropped, for ``log_trimmed``.

``find_dead`` reads the KV bucket ``hurtle-dead-index`` (key: the message id as a token; value:
its queue and dead letter's sequence), whose entries live as long as dead letters
(``dead_letter_ttl``). JetStream writes one stream at a time, so the entry is written right
after its dead letter and removed with it (by ``delete`` and ``purge``, and by a write for those
the cap is about to drop), each only while it names that dead letter; a lookup checks that the
dead letter it names is the message's and reads a stale entry (its client died in between) as
nothing.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from nats.js import api
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)

from ...message import message_id
from ..base import DeadLetter
from . import names
from .store import Store, pack, unpack

#: The KV bucket of dead letters by message id.
INDEX_BUCKET = "hurtle-dead-index"


class DeadLetters:
    def __init__(self, store: Store, dead_letter_max: int, dead_letter_ttl: float) -> None:
        self.store = store
        self.max = dead_letter_max
        self.ttl = dead_letter_ttl
        self._made: set[str] = set()

    async def _ensure(self, queue: str) -> None:
        if queue in self._made:
            return
        config = api.StreamConfig(
            name=names.dead_stream(queue),
            description=queue,
            subjects=[names.dead_subject(queue)],
            retention=api.RetentionPolicy.LIMITS,
            max_msgs=self.max or -1,
            max_age=self.ttl or None,
            discard=api.DiscardPolicy.OLD,
        )
        try:
            await self.store.js.add_stream(config)
        except APIError as err:
            if err.err_code != 10058:
                raise
            await self.store.js.update_stream(config)  # this broker's limits from now on
        self._made.add(queue)

    async def write(self, queue: str, items: list[tuple[bytes, str]]) -> tuple[int, int]:
        """Store ``(raw, reason)`` items; returns ``(expired, dropped)`` for ``log_trimmed``."""
        await self._ensure(queue)
        js = self.store.js
        stream = names.dead_stream(queue)
        now = time.time()
        expired = 0
        if self.ttl:
            expired = await self._drop_before(queue, now - self.ttl)
        before = (await js.stream_info(stream)).state.messages
        dropped = max(0, before + len(items) - self.max) if self.max else 0
        if dropped:  # the oldest, which the server drops to make room: out of the index first
            await self._unindex(queue, await self._oldest(queue, dropped))
        written = []
        for raw, reason in items:
            headers = {names.REASON: reason or "-", names.FAILED_AT: repr(now)}
            ack = await js.publish(names.dead_subject(queue), raw, headers=headers)
            written.append((message_id(raw), ack.seq))
        index = await self._index()
        for key, seq in written:
            if key:
                await index.put(names.token(key), pack([queue, seq]))
        return expired, dropped

    async def _index(self) -> Any:
        return await self.store.kv(INDEX_BUCKET, ttl=self.ttl or None)

    async def _oldest(self, queue: str, n: int) -> list[Any]:
        out: list[Any] = []
        seq = 1
        while len(out) < n:
            try:
                msg = await self.store.js.get_msg(
                    names.dead_stream(queue), seq=seq, subject=names.dead_subject(queue), next=True
                )
            except NotFoundError:
                break
            out.append(msg)
            seq = msg.seq + 1
        return out

    async def _unindex(self, queue: str, msgs: list[Any]) -> None:
        """Remove the entries of these dead letters, each only while it names that one."""
        index = await self._index()
        for msg in msgs:
            key = message_id(bytes(msg.data or b""))
            if not key:
                continue
            try:
                entry = await index.get(names.token(key))
            except (KeyNotFoundError, NotFoundError):
                continue
            if entry.value is not None and unpack(entry.value) == [queue, msg.seq]:
                # written again meanwhile: a later dead letter's entry, which stays
                with contextlib.suppress(KeyWrongLastSequenceError, BadRequestError):
                    await index.delete(names.token(key), last=entry.revision)

    async def find(self, message_id_: str) -> DeadLetter | None:
        index = await self._index()
        try:
            entry = await index.get(names.token(message_id_))
        except (KeyNotFoundError, NotFoundError):
            return None
        if entry.value is None:
            return None
        queue, seq = unpack(entry.value)
        try:
            msg = await self.store.js.get_msg(names.dead_stream(queue), seq=seq)
        except NotFoundError:
            return None
        dead = _letter(queue, msg)
        return dead if message_id(dead.raw) == message_id_ else None

    async def _drop_before(self, queue: str, cutoff: float) -> int:
        js = self.store.js
        stream = names.dead_stream(queue)
        subject = names.dead_subject(queue)
        seq, n = 1, 0
        while True:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            if float((msg.headers or {}).get(names.FAILED_AT, "0")) >= cutoff:
                break
            n += 1
            seq = msg.seq + 1
        if n:
            await js.purge_stream(stream, seq=seq)
        return n

    async def page(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        js = self.store.js
        stream = names.dead_stream(queue)
        subject = names.dead_subject(queue)
        out: list[DeadLetter] = []
        seq, skipped = 1, 0
        while len(out) < limit:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            seq = msg.seq + 1
            if skipped < offset:
                skipped += 1
                continue
            out.append(_letter(queue, msg))
        return out

    async def delete(self, queue: str, ids: list[str]) -> int:
        n = 0
        stream = names.dead_stream(queue)
        for id_ in ids:
            if not id_.isdigit():
                continue
            try:
                msg = await self.store.js.get_msg(stream, seq=int(id_))
                await self.store.js.delete_msg(stream, int(id_))
            except APIError:  # no such dead letter
                continue
            await self._unindex(queue, [msg])
            n += 1
        return n

    async def purge(self, queue: str) -> int:
        try:
            n = int((await self.store.js.stream_info(names.dead_stream(queue))).state.messages)
        except NotFoundError:
            return 0
        await self._unindex(queue, await self._oldest(queue, n))
        await self.store.js.purge_stream(names.dead_stream(queue))
        return n

    async def count(self, queue: str) -> int:
        try:
            return int((await self.store.js.stream_info(names.dead_stream(queue))).state.messages)
        except NotFoundError:
            return 0


def _letter(queue: str, msg: Any) -> DeadLetter:
    headers = msg.headers or {}
    return DeadLetter(
        id=str(msg.seq),
        queue=queue,
        reason=headers.get(names.REASON, ""),
        raw=bytes(msg.data or b""),
        failed_at=float(headers.get(names.FAILED_AT, "0")),
    )
