"""``MemoryBroker``'s tick claims (``Broker.claim_tick``'s step in the store): the check, the
record, the unique locks and the publish under the broker's one lock, judged by this process's
clock."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..message import Message
from .ticks import TAKEN, WON, TickBatch, TickClaim, claimable, remember, too_early


class _Ticks:
    """``MemoryBroker``'s side of periodic tasks."""

    _lock: threading.Lock
    _wake: threading.Condition
    _ticks: dict[tuple[str, str], list[float]]  # (queue, schedule) -> recent claimed ticks

    if TYPE_CHECKING:  # MemoryBroker's

        def _put(self, queue: str, raw: bytes, priority: int, eta: float) -> None: ...

        def _take_lock(self, m: Message, key: str, now: float, unique_for: float) -> str: ...

    def _store_tick(self, batch: TickBatch) -> TickClaim:
        tick, keys, unique_for = batch.tick, batch.keys, batch.unique_for
        schedule = (batch.queue, batch.name)
        with self._lock:
            now = time.time()
            recent = self._ticks.get(schedule, [])
            if not claimable(tick, recent, recent[-1] if recent else None):
                return TAKEN
            early = too_early(tick, now)
            if early is not None:
                return early
            self._ticks[schedule] = remember(tick, recent)
            held_by = None
            for i, (m, raw) in enumerate(zip(batch.messages, batch.payloads, strict=True)):
                if keys is not None and unique_for is not None:
                    holder = self._take_lock(m, keys[i], now, unique_for)
                    if holder != m.id:
                        held_by = held_by or holder
                        continue
                self._put(m.queue, raw, m.priority, m.eta)
            self._wake.notify_all()
        return WON if held_by is None else TickClaim(True, held_by=held_by)

    def last_tick(self, queue: str, name: str) -> float | None:
        with self._lock:
            recent = self._ticks.get((queue, name))
            return recent[-1] if recent else None
