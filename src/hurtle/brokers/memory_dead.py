"""``MemoryBroker``'s dead letters: the letters of each queue, oldest first, their limits, and
the index of them by message id that ``find_dead`` reads (kept under the broker's lock in the
same step as every write and removal)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..message import message_id
from .records import DeadLetter

if TYPE_CHECKING:
    from .memory import _Queue


class MemoryDeadLetters:
    """Mixed into ``MemoryBroker``, whose lock guards everything here."""

    _lock: threading.Lock
    _queues: dict[str, _Queue]
    dead_letter_max: int
    dead_letter_ttl: float
    #: message id -> (queue, dead-letter id) of its latest dead letter
    _dead_index: dict[str, tuple[str, str]]

    def _add_dead_locked(self, q: _Queue, dead: DeadLetter) -> None:
        q.dead[dead.id] = dead
        if key := message_id(dead.raw):
            self._dead_index[key] = (dead.queue, dead.id)

    def _forget_dead_locked(self, deads: Iterable[DeadLetter]) -> None:
        index = self._dead_index
        for dead in deads:
            key = message_id(dead.raw)
            if key and index.get(key) == (dead.queue, dead.id):
                del index[key]

    def _trim_dead_locked(self, q: _Queue, now: float) -> tuple[int, int]:
        """Drop dead letters past the ttl, then the oldest beyond the cap; (expired, dropped)."""
        dead = q.dead
        gone: list[DeadLetter] = []
        expired = dropped = 0
        if self.dead_letter_ttl:
            cutoff = now - self.dead_letter_ttl
            while dead and next(iter(dead.values())).failed_at < cutoff:
                gone.append(dead.pop(next(iter(dead))))
                expired += 1
        if self.dead_letter_max:
            while len(dead) > self.dead_letter_max:
                gone.append(dead.pop(next(iter(dead))))
                dropped += 1
        self._forget_dead_locked(gone)
        return expired, dropped

    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        with self._lock:
            q = self._queues.get(queue)
            if q is None:
                return []
            return list(itertools.islice(q.dead.values(), offset, offset + limit))

    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        with self._lock:
            where = self._dead_index.get(message_id)
            if where is None:
                return None
            q = self._queues.get(where[0])
            return None if q is None else q.dead.get(where[1])

    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        with self._lock:
            q = self._queues.get(queue)
            if q is None:
                return 0
            gone = [d for i in ids if (d := q.dead.pop(i, None)) is not None]
            self._forget_dead_locked(gone)
            return len(gone)

    def _stored_purge_dead(self, queue: str) -> int:
        with self._lock:
            q = self._queues.get(queue)
            if q is None:
                return 0
            self._forget_dead_locked(q.dead.values())
            n = len(q.dead)
            q.dead.clear()
            return n
