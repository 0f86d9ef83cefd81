"""Limits held by a consumer: concurrency slots and unique locks."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..keys import queue_keys, slot_keys
from .scripts import _Command, _packed

if TYPE_CHECKING:
    from .broker import RedisBroker


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

    def release_unique(self, locks: Sequence[tuple[str, str, str]]) -> None:
        if not locks:
            return
        queues = {lock[0] for lock in locks}
        by_queue: dict[str, Sequence[tuple[str, str, str]]]
        if len(queues) == 1:  # the usual case: no grouping per lock
            by_queue = {queues.pop(): locks}
        else:
            grouped: dict[str, list[tuple[str, str, str]]] = {}
            for lock in locks:
                grouped.setdefault(lock[0], []).append(lock)
            by_queue = dict(grouped)
        script = self.broker._scripts.unique_release
        commands = []
        for queue, group in by_queue.items():
            keys, packed_keys = _packed([lock[1] for lock in group])
            ids, packed_ids = _packed([lock[2] for lock in group])
            lengths = [0] * (2 * len(group))
            lengths[0::2] = map(len, keys)
            lengths[1::2] = map(len, ids)
            args = (packed_keys, packed_ids, struct.pack(f"<{len(lengths)}I", *lengths))
            commands.append(self.broker._call(script, (queue_keys(queue).unique,), args))
        self.broker._pipeline(commands, f"releasing {len(locks)} unique locks")
