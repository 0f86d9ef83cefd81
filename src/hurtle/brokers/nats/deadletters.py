"""Dead letters: a limits stream per queue (``HD_<queue>``), its messages the raw bytes with the
reason and the time in headers.

A dead letter's id is a new hurtle id, as on the other brokers, and the last token of its
subject (``hd.<queue>.<id>``): deleting one by id reads its sequence by that subject. Its
reason is kept JSON-encoded in ``Hurtle-Reason-Json`` (header values cannot hold line breaks,
and a traceback's lines must survive), cut in the middle if it would not fit beside the raw
bytes in the server's ``max_payload``. Dead letters written before either existed (on the
subject ``hd.<queue>``, the reason flattened in ``Hurtle-Reason``) still read, with their
sequence as their id.

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
import json
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

from ...ids import new_id
from ...message import message_id
from ..records import DeadLetter
from . import names
from .store import Store, pack, unpack

#: The KV bucket of dead letters by message id.
INDEX_BUCKET = "hurtle-dead-index"

#: Bytes of a dead letter kept for its headers other than the reason (ids, time, framing).
HEADERS_ROOM = 512


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
            subjects=[names.dead_subject(queue), f"{names.dead_subject(queue)}.*"],
            retention=api.RetentionPolicy.LIMITS,
            max_msgs=self.max or -1,
            max_age=self.ttl or None,
            discard=api.DiscardPolicy.OLD,
            num_replicas=self.store.replicas,
        )
        try:
            await self.store.add_stream(config)
        except APIError as err:
            if err.err_code != 10058:
                raise
            await self.store.js.update_stream(config)  # this broker's limits from now on
        await self.store.led(names.dead_stream(queue))
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
        most = self.store.nc.max_payload - HEADERS_ROOM
        written = []
        for raw, reason in items:
            headers = {
                names.REASON_JSON: _fit(reason or "-", most - len(raw)),
                names.FAILED_AT: repr(now),
            }
            subject = f"{names.dead_subject(queue)}.{new_id()}"
            ack = await js.publish(subject, raw, headers=headers)
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
                    names.dead_stream(queue), seq=seq, subject=_EVERY, next=True
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
        seq, n = 1, 0
        while True:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=_EVERY, next=True)
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
        out: list[DeadLetter] = []
        seq, skipped = 1, 0
        while len(out) < limit:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=_EVERY, next=True)
            except NotFoundError:
                break
            seq = msg.seq + 1
            if skipped < offset:
                skipped += 1
                continue
            out.append(_letter(queue, msg))
        return out

    async def delete(self, queue: str, ids: list[str]) -> int:
        stream = names.dead_stream(queue)
        n = 0
        for id_ in ids:
            seq = await self._seq_of(queue, id_)
            if not seq:
                continue
            try:
                msg = await self.store.js.get_msg(stream, seq=seq)
                await self.store.js.delete_msg(stream, seq)
            except APIError:  # deleted meanwhile
                continue
            await self._unindex(queue, [msg])
            n += 1
        return n

    async def _seq_of(self, queue: str, id_: str) -> int:
        """The sequence of the dead letter ``id_`` of ``queue`` in its stream, 0 if none."""
        js = self.store.js
        stream = names.dead_stream(queue)
        subject = names.dead_subject(queue)
        try:
            if names.token(id_) == id_:
                return int((await js.get_msg(stream, subject=f"{subject}.{id_}")).seq)
        except NotFoundError:
            pass
        if not id_.isdigit():
            return 0
        try:  # written before ids: its sequence, on the old subject
            found = await js.get_msg(stream, seq=int(id_))
        except NotFoundError:
            return 0
        return int(id_) if found.subject == subject else 0

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


#: Every subject of a dead-letter stream (its messages, of either form).
_EVERY = ">"


def _letter(queue: str, msg: Any) -> DeadLetter:
    headers = msg.headers or {}
    subject = msg.subject or ""
    legacy = subject == names.dead_subject(queue)
    encoded = headers.get(names.REASON_JSON)
    try:
        reason = json.loads(encoded) if encoded is not None else headers.get(names.REASON, "")
    except ValueError:
        reason = encoded or ""
    return DeadLetter(
        id=str(msg.seq) if legacy else subject.rsplit(".", 1)[-1],
        queue=queue,
        reason=str(reason),
        raw=bytes(msg.data or b""),
        failed_at=float(headers.get(names.FAILED_AT, "0")),
    )


def _fit(reason: str, room: int) -> str:
    """``reason`` JSON-encoded in at most ``room`` bytes (at least a few hundred), cut in the
    middle, where a traceback repeats itself, when longer."""
    encoded = json.dumps(reason)
    if len(encoded.encode()) <= room:
        return encoded
    keep = max(room, 600) // 2 - 40
    cut = len(encoded.encode()) - max(room, 600)
    text = f"{reason[:keep]}\n... ({cut:,} bytes cut) ...\n{reason[-keep:]}"
    while len(json.dumps(text).encode()) > max(room, 600) and keep > 20:
        keep //= 2
        text = f"{reason[:keep]}\n... (cut) ...\n{reason[-keep:]}"
    return json.dumps(text)
