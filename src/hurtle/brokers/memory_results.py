"""``MemoryBroker``'s records beside its queues: task results, progress reports and chords'
member results, each kept with its expiry, and the watchers a stored result wakes.

Reads skip expired records, and a write drops them all at most once a second (a scan: cheaper
than keeping them in order per write). Watchers are called once the broker's lock is released.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from .records import ChordStep, StoredResult
from .waiters import watch


class MemoryResults:
    """Mixed into ``MemoryBroker``, whose lock guards everything here."""

    _lock: threading.Lock
    _results: dict[str, tuple[bytes, float]]  # id -> (payload, expires at)
    _next_prune: float
    _watchers: dict[str, list[Callable[[], None]]]
    # chords: id -> (member index -> payload, fired, expires at)
    _chords: dict[str, tuple[dict[int, bytes], bool, float]]
    _next_chord_prune: float
    _progress: dict[str, tuple[bytes, float]]  # id -> (payload, expires at)

    def _store_results_locked(self, results: Sequence[StoredResult]) -> list[Callable[[], None]]:
        """Keep the records, drop expired ones; returns the wake-ups to call after the lock."""
        now = time.time()
        kept = self._results
        if now >= self._next_prune:
            self._next_prune = now + 1.0
            for id_ in [i for i, (_, expires) in kept.items() if expires <= now]:
                del kept[id_]
        for r in results:
            kept[r.id] = (r.payload, now + r.ttl)
        watchers = self._watchers
        if not watchers:
            return []
        return [w for r in results for w in watchers.get(r.id, ())]

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        now = time.time()
        with self._lock:
            kept = self._progress
            for id_ in [i for i, (_, expires) in kept.items() if expires <= now]:
                del kept[id_]
            for r in reports:
                kept[r.id] = (r.payload, now + r.ttl)

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        now = time.time()
        with self._lock:
            found = [self._progress.get(i) for i in ids]
        return [None if f is None or f[1] <= now else f[0] for f in found]

    def get_result(self, id: str) -> bytes | None:
        with self._lock:
            kept = self._results.get(id)
        if kept is None or kept[1] <= time.time():
            return None
        return kept[0]

    def watch_results(
        self, ids: Sequence[str], wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        return watch(self._lock, self._watchers, ids, wake)

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        with self._lock:
            chord = self._chords.get(id)
            if chord is None or chord[2] <= time.time():
                return None
            members = chord[0]
            if len(members) < total:
                return None
            return [members[i] for i in range(total)]

    def _chord_step_locked(self, step: ChordStep, now: float) -> bool:
        """Count a chord member; True when this step completes the chord (publish its callback)."""
        chords = self._chords
        if now >= self._next_chord_prune:  # at most once a second, like results
            self._next_chord_prune = now + 1.0
            for id_ in [i for i, (_, _, expires) in chords.items() if expires <= now]:
                del chords[id_]
        chord = chords.get(step.id)
        if chord is None or chord[2] <= now:
            chord = ({}, False, 0.0)
        members, fired, _ = chord
        members.setdefault(step.index, step.payload)
        complete = not fired and len(members) >= step.total
        chords[step.id] = (members, fired or complete, now + step.ttl)
        return complete
