"""Limits held by a consumer: concurrency slots and unique locks."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

from ..columns import UniqueLocks
from ..keys import queue_keys, slot_keys
from ..records import Lock
from .scripts import RAW, _Command, _packed

if TYPE_CHECKING:
    from .broker import RedisBroker

#: A unique lock that ends more than this many seconds from now is released without reading
#: it (``release_unique``): room for the server's clock as this process reckons it, and for
#: the time the release takes to reach the server.
SURE_FOR = 10.0
_QUEUE = itemgetter(0)


def _hdel(key: str, fields: list[str]) -> bytes:
    """The RESP bytes of ``HDEL key field ...``. Fields of one length in ASCII (the locks of one
    task, most often) are joined by their common header in one ``str.join`` and encoded once,
    about ten times faster than a header per field; others take a header each (hiredis takes a
    call per field)."""
    n = len(fields)
    name = key.encode()
    head = b"*%d\r\n$4\r\nHDEL\r\n$%d\r\n%s\r\n" % (n + 2, len(name), name)
    sizes = set(map(len, fields))
    if len(sizes) == 1:
        sep = f"\r\n${sizes.pop()}\r\n"
        joined = sep.join(fields)
        if joined.isascii():  # so each field's length in bytes is its length in characters
            return b"".join((head, sep[2:].encode(), joined.encode(), b"\r\n"))
    raw = [f.encode() for f in fields]
    heads: dict[int, bytes] = {}  # length -> the field's header, after the line end before it
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = [heads.get(k) or heads.setdefault(k, b"\r\n$%d\r\n" % k) for k in map(len, raw)]
    parts[1::2] = raw
    parts[0] = parts[0][2:]  # the first needs no line end before it
    return b"".join((head, b"".join(parts), b"\r\n"))


_KEY = itemgetter(1)
_UNTIL = itemgetter(3)


class _Limits:
    """``RedisConsumer``'s slots and unique locks."""

    broker: RedisBroker
    worker_id: str
    _timeout_arg: str
    #: concurrency key -> slots this consumer holds (their deadlines move with each beat)
    _slots: dict[str, int]

    def _slot_commands(
        self, broker: RedisBroker, changes: Iterable[tuple[str, int, int]]
    ) -> list[_Command]:
        script = broker._scripts.slots
        return [
            broker._call(script, slot_keys(key), (self.worker_id, self._timeout_arg, limit, n))
            for key, limit, n in changes
        ]

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        if not requests:
            return []
        got = self.broker._pipeline(
            self._slot_commands(self.broker, requests),
            f"taking slots of {len(requests)} concurrency limits",
        )
        for (key, _, _), n in zip(requests, got, strict=True):
            if n:
                self._slots[key] = self._slots.get(key, 0) + int(n)
        return [int(n) for n in got]

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        if not releases:
            return
        self.broker._pipeline(
            self._slot_commands(self.broker, ((key, 0, -n) for key, n in releases)),
            f"giving back slots of {len(releases)} concurrency limits",
        )
        for key, n in releases:
            left = self._slots.get(key, 0) - n
            if left > 0:
                self._slots[key] = left
            else:
                self._slots.pop(key, None)

    def _touch_slots(self, broker: RedisBroker) -> None:
        """Move the deadline of the slots this consumer holds (with each heartbeat)."""
        held = list(self._slots)
        if held:
            broker._pipeline(
                self._slot_commands(broker, ((key, 0, 0) for key in held)),
                "refreshing concurrency slots",
            )

    def release_unique(self, locks: Sequence[Lock]) -> None:
        """A lock that ends more than ``SURE_FOR`` seconds from now (by the server's clock) is
        still its message's: it passes to another message only once it ended or was
        released, and only the settled delivery of a message releases it. Those go in one
        plain ``HDEL`` per queue; the others (near their end, or whose end is unknown) through
        ``unique_release.lua``, which ends each only while it holds the message's id."""
        commands = self._unique_commands(locks)
        if commands:
            self.broker._pipeline_raw(commands, f"releasing {len(locks)} unique locks")

    def _unique_commands(self, locks: Sequence[Lock]) -> list[_Command]:
        if not locks:
            return []
        sure_until = self.broker._server_ms() / 1000 + SURE_FOR
        if isinstance(locks, UniqueLocks) and min(locks.untils) > sure_until:
            # a worker's flush, in columns: one HDEL, packed here when it can be
            key = queue_keys(locks.queue).unique
            if self.broker._raw_ok:
                return [((RAW, _hdel(key, locks.keys)), None)]
            return [(("HDEL", key, *locks.keys), None)]
        queue = locks[0][0]
        if min(map(_UNTIL, locks)) > sure_until and len(set(map(_QUEUE, locks))) == 1:
            # the usual flush: one queue, every lock far from its end (a few C loops, no
            # Python one)
            return [(("HDEL", queue_keys(queue).unique, *map(_KEY, locks)), None)]
        by_queue: dict[str, tuple[list[str], list[Lock]]] = {}
        for lock in locks:
            group = by_queue.get(lock[0])
            if group is None:
                group = by_queue[lock[0]] = ([], [])
            if lock[3] > sure_until:
                group[0].append(lock[1])
            else:
                group[1].append(lock)
        script = self.broker._scripts.unique_release
        commands: list[_Command] = []
        for queue, (sure, checked) in by_queue.items():
            key = queue_keys(queue).unique
            if sure:
                commands.append((("HDEL", key, *sure), None))
            if checked:
                keys, packed_keys = _packed([lock[1] for lock in checked])
                ids, packed_ids = _packed([lock[2] for lock in checked])
                lengths = [0] * (2 * len(checked))
                lengths[0::2] = map(len, keys)
                lengths[1::2] = map(len, ids)
                args = (packed_keys, packed_ids, struct.pack(f"<{len(lengths)}I", *lengths))
                commands.append(self.broker._call(script, (key,), args))
        return commands
