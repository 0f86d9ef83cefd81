"""``memory://``: the whole contract in one process, for unit tests and ``hurtle.testing``.

Messages live in Python structures behind one lock; nothing survives the process. Consumers in
several threads of the same process see one store.

Settling a delivery that is no longer held (settled before, or recovered from a consumer declared
dead) changes nothing, as on every broker.

Each consumer keeps the heartbeat timeout its broker had when it was made, and its deadline (a
beat plus that timeout) is what recovery checks.

Poison messages are handled as in the Redis broker (``lua/heartbeat.lua`` explains how): deaths
are counted per message, a message recovered a second time waits in quarantine and is let out
one at a time, and a message whose worker dies holding it alone (or no other message let out
that way) becomes a dead letter past ``max_recoveries`` deaths, ending what waits on it
(``common.dead_ends``).

What a worker holds and settles is ``memory_consumer.py``'s ``MemoryConsumer``; results,
progress reports and chords are ``memory_results.py``'s, dead letters ``memory_dead.py``'s and
tick claims ``memory_ticks.py``'s.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Unpack

from ..errors import DecodeError
from ..ids import new_id
from ..message import MAX_PRIORITY, Message, check_messages, encode_many
from .base import Broker, BrokerOptions, Consumer
from .common import (
    check_cancel_ttl,
    check_queue_name,
    dead_ends,
    gcra,
    lock_end,
    lost_reason,
    unique_key_of,
)
from .memory_consumer import MemoryConsumer
from .memory_dead import MemoryDeadLetters
from .memory_results import MemoryResults
from .memory_ticks import _Ticks
from .records import DeadLetter, QueueStats
from .reports import TaskCounts, WorkerReport

_LEVELS = MAX_PRIORITY + 1


#: Most recovered messages whose deaths a queue remembers (those with the fewest go first).
MAX_DEATHS = 10_000
#: Most quarantined messages let out that a queue remembers (the oldest go first).
MAX_PROBES = 1000
#: Unique locks kept before the expired ones are dropped.
MAX_UNIQUE = 10_000


class _Queue:
    __slots__ = ("dead", "deaths", "delayed", "last_probe", "probes", "quarantine", "ready")

    def __init__(self) -> None:
        self.ready: list[deque[bytes]] = [deque() for _ in range(_LEVELS)]
        self.delayed: list[tuple[float, int, int, bytes]] = []  # (eta, seq, priority, raw)
        self.dead: dict[str, DeadLetter] = {}
        self.quarantine: deque[tuple[int, bytes]] = deque()  # (priority, raw)
        self.deaths: dict[bytes, int] = {}  # raw -> deaths of its workers
        # quarantined messages let out and not recovered since, oldest first
        self.probes: dict[bytes, None] = {}
        self.last_probe: tuple[int, bytes] | None = None

    def ready_count(self) -> int:
        return sum(len(level) for level in self.ready) + len(self.quarantine)


class MemoryBroker(MemoryResults, MemoryDeadLetters, _Ticks, Broker):
    def __init__(self, url: str = "memory://", **options: Unpack[BrokerOptions]) -> None:
        super().__init__(**options)
        self.url = url
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queues: dict[str, _Queue] = {}
        # worker id -> receipt -> (queue, raw, priority)
        self._held: dict[str, dict[int, tuple[str, bytes, int]]] = {}
        self._deadline: dict[str, float] = {}  # worker id -> when it counts as dead
        self._seq = itertools.count()
        self._ticks: dict[tuple[str, str], list[float]] = {}  # (queue, schedule) -> recent ticks
        self._reports: dict[str, WorkerReport] = {}  # worker id -> last report, with deadline
        self._totals: list[TaskCounts] = []
        # results: id -> (payload, expires at); reads skip expired ones, and a write at most
        # once a second drops them all (a scan: cheaper than keeping them in order per write)
        self._results: dict[str, tuple[bytes, float]] = {}
        self._next_prune = 0.0
        self._watchers: dict[str, list[Callable[[], None]]] = {}
        self._tat: dict[str, float] = {}  # rate key -> theoretical arrival time
        self._slots: dict[str, dict[str, int]] = {}  # concurrency key -> worker id -> slots
        self._unique: dict[tuple[str, str], tuple[str, float]] = {}  # -> (message id, expiry)
        # chords: id -> (member index -> payload, fired, expires at)
        self._chords: dict[str, tuple[dict[int, bytes], bool, float]] = {}
        self._next_chord_prune = 0.0
        # cancelled message id -> until when; ``_cancel_until`` is the latest of those times, so
        # that a fetch knows in one compare whether any may still be live
        self._cancelled: dict[str, float] = {}
        self._cancel_until = 0.0
        self._paused: set[str] = set()
        # progress reports: id -> (payload, expires at), pruned like results
        self._progress: dict[str, tuple[bytes, float]] = {}
        self._dead_index: dict[str, tuple[str, str]] = {}

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Queue()
        return q

    def _put(self, queue: str, raw: bytes, priority: int, eta: float) -> None:
        q = self._queue(queue)
        if eta > time.time():
            heapq.heappush(q.delayed, (eta, next(self._seq), priority, raw))
        else:
            q.ready[priority].append(raw)

    def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        payloads = encode_many(list(messages), self.max_message_size)
        with self._lock:
            for m, raw in zip(messages, payloads, strict=True):
                self._put(m.queue, raw, m.priority, m.eta)
            self._wake.notify_all()

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        check_messages(messages)
        keys = [unique_key_of(m) for m in messages]
        payloads = encode_many(list(messages), self.max_message_size)
        out: list[str] = []
        with self._lock:
            now = time.time()
            if len(self._unique) > MAX_UNIQUE:  # forget expired locks, now and then
                self._unique = {k: v for k, v in self._unique.items() if v[1] > now}
            for m, key, raw in zip(messages, keys, payloads, strict=True):
                holder = self._take_lock(m, key, now, unique_for)
                if holder == m.id:
                    self._put(m.queue, raw, m.priority, m.eta)
                out.append(holder)
            self._wake.notify_all()
        return out

    def _take_lock(self, m: Message, key: str, now: float, unique_for: float) -> str:
        """Take the unique lock ``key`` for ``m`` unless another message holds it: the id of
        the one that does. Called with ``_lock`` held."""
        held = self._unique.get((m.queue, key))
        if held is not None and held[1] > now:
            return held[0]
        self._unique[(m.queue, key)] = (m.id, lock_end(m, now, unique_for))
        return m.id

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        out = []
        with self._lock:
            now = time.time()
            for key, limit, period, wanted in requests:
                granted, wait, tat = gcra(self._tat.get(key, 0.0), now, limit, period, wanted)
                self._tat[key] = tat
                out.append((granted, wait))
        return out

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        ttl = check_cancel_ttl(ttl)
        with self._lock:
            now = time.time()
            if self._cancel_until <= now:
                self._cancelled.clear()
            elif len(self._cancelled) > MAX_UNIQUE:
                self._cancelled = {k: v for k, v in self._cancelled.items() if v > now}
            until = now + ttl
            for id_ in ids:
                self._cancelled[str(id_)] = until
            self._cancel_until = max(self._cancel_until, until)

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        with self._lock:
            now = time.time()
            get = self._cancelled.get
            return {id_ for id_ in ids if get(id_, 0.0) > now}

    def cancellations_live(self) -> bool:
        with self._lock:
            now = time.time()
            return self._cancel_until > now and any(v > now for v in self._cancelled.values())

    def uncancel(self, ids: Sequence[str]) -> None:
        with self._lock:
            for id_ in ids:
                self._cancelled.pop(id_, None)

    def pause(self, queue: str) -> None:
        check_queue_name(queue)
        with self._lock:
            self._paused.add(queue)
            self._queue(queue)

    def resume(self, queue: str) -> None:
        check_queue_name(queue)
        with self._lock:
            self._paused.discard(queue)
            self._wake.notify_all()

    def paused(self) -> set[str]:
        with self._lock:
            return set(self._paused)

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        with self._lock:
            for raw in payloads:
                self._put(queue, bytes(raw), 0, 0.0)
            self._wake.notify_all()

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> Consumer:
        return MemoryConsumer(self, tuple(queues), worker_id or f"memory-{new_id()}")

    def queues(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        with self._lock:
            names = list(self._queues) if queues is None else list(queues)
            in_flight: dict[str, int] = {}
            for held in self._held.values():
                for queue, _, _ in held.values():
                    in_flight[queue] = in_flight.get(queue, 0) + 1
            out = {}
            for name in names:
                q = self._queues.get(name) or _Queue()
                out[name] = QueueStats(
                    ready=q.ready_count(),
                    delayed=len(q.delayed),
                    in_flight=in_flight.get(name, 0),
                    dead=len(q.dead),
                    paused=name in self._paused,
                )
            return out

    def recover(self) -> int:
        with self._lock:
            return self._recover_locked()

    def _recover_locked(self) -> int:
        now = time.time()
        moved = 0
        for worker_id, deadline in list(self._deadline.items()):
            if deadline < now:
                moved += self._recover_held_locked(self._held.pop(worker_id, {}), now)
                del self._deadline[worker_id]
        released = False
        for q in self._queues.values():
            released = self._let_one_out_locked(q) or released
        if moved or released:
            self._wake.notify_all()
        return moved

    def _recover_held_locked(self, held: dict[int, tuple[str, bytes, int]], now: float) -> int:
        """What one dead worker held: back to the queue, to quarantine or to the dead letters."""
        # across all its queues, unlike Redis (one queue per script)
        lone = sum(raw in self._queue(queue).probes for queue, raw, _ in held.values()) == 1
        alone = len(held) == 1  # the only message its worker held: the only suspect
        back = []
        for queue, raw, priority in held.values():
            q = self._queue(queue)
            deaths = q.deaths[raw] = q.deaths.get(raw, 0) + 1
            probe = raw in q.probes
            q.probes.pop(raw, None)
            if (alone or (probe and lone)) and deaths > self.max_recoveries:
                del q.deaths[raw]
                self._dead_lost_locked(q, queue, raw, lost_reason(deaths, self.max_recoveries), now)
            elif deaths >= 2:
                q.quarantine.append((priority, raw))
            else:
                back.append((queue, raw, priority))
            if len(q.deaths) > MAX_DEATHS:
                del q.deaths[min(q.deaths, key=q.deaths.__getitem__)]
        self._requeue_locked(back)
        return len(held)

    def _dead_lost_locked(self, q: _Queue, queue: str, raw: bytes, reason: str, now: float) -> None:
        """Dead-letter a message whose workers kept dying, and end what waits on it
        (``dead_ends``): its records (its own, its workflow's) and its unique lock."""
        self._add_dead_locked(
            q, DeadLetter(id=new_id(), queue=queue, raw=raw, failed_at=now, reason=reason)
        )
        records, lock = dead_ends(raw, reason)
        if lock is not None:
            held = self._unique.get((queue, lock[0]))
            if held is not None and held[0] == lock[1]:
                del self._unique[(queue, lock[0])]
        for wake in self._store_results_locked(records):
            wake()  # sets an event: takes no lock of this broker

    @staticmethod
    def _let_one_out_locked(q: _Queue) -> bool:
        """Let one quarantined message out, unless the last one is still waiting to be taken.
        The last one is forgotten once taken (fetches look for it while it is known)."""
        probe = q.last_probe
        if probe is None and not q.quarantine:
            return False
        if probe is not None and probe[1] in q.ready[probe[0]]:
            return False
        q.last_probe = None
        if not q.quarantine:
            return False
        priority, raw = q.last_probe = q.quarantine.popleft()
        q.ready[priority].appendleft(raw)
        q.probes[raw] = None
        if len(q.probes) > MAX_PROBES:
            del q.probes[next(iter(q.probes))]
        return True

    def _requeue_locked(self, items: Iterable[tuple[str, bytes, int]]) -> int:
        n = 0
        for queue, raw, priority in items:
            self._queue(queue).ready[priority].appendleft(raw)
            n += 1
        return n

    def _promote_locked(self, q: _Queue, now: float) -> None:
        while q.delayed and q.delayed[0][0] <= now:
            _, _, priority, raw = heapq.heappop(q.delayed)
            q.ready[priority].append(raw)

    def _next_eta_locked(self, queues: Sequence[str]) -> float | None:
        etas = [q.delayed[0][0] for n in queues if (q := self._queues.get(n)) and q.delayed]
        return min(etas) if etas else None

    def fast_forward(self, queues: Iterable[str] | None = None) -> int:
        """Make ready now, in the order they were due, the delayed messages of ``queues`` (all
        by default) that wait for their own time (a send's ``delay``/``eta``, a retry's
        backoff), as if it had come; returns how many. Messages a rate or concurrency limit
        put back keep their turn: the limit would only put them back again. For tests
        (``hurtle.testing``): no other broker has this."""
        with self._lock:
            moved = 0
            for name in list(self._queues) if queues is None else queues:
                q = self._queues.get(name)
                if q is None or not q.delayed:
                    continue
                kept = []
                for entry in sorted(q.delayed):
                    eta, _, priority, raw = entry
                    try:
                        own = Message.decode(raw).eta  # a deferral keeps the message's own
                    except DecodeError:
                        own = eta
                    if own >= eta:
                        q.ready[priority].append(raw)
                        moved += 1
                    else:
                        kept.append(entry)
                q.delayed = kept  # sorted: a heap already
            if moved:
                self._wake.notify_all()
            return moved

    def _stored_purge(self, queues: Sequence[str]) -> int:
        n = 0
        with self._lock:
            for queue in queues:
                q = self._queues.get(queue)
                if q is None:
                    continue
                n += q.ready_count() + len(q.delayed)
                for level in q.ready:
                    level.clear()
                q.quarantine.clear()
                q.delayed.clear()
        return n

    def forget(self, queue: str) -> bool:
        check_queue_name(queue)
        with self._lock:
            q = self._queues.get(queue)
            if q is None:
                return True
            held = any(h[0] == queue for hs in self._held.values() for h in hs.values())
            if q.ready_count() or q.delayed or q.dead or held or queue in self._paused:
                return False
            del self._queues[queue]
            return True

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        with self._lock:
            q = self._queues.get(queue)
            if q is None:
                return []
            return [(eta, raw) for eta, _, _, raw in heapq.nsmallest(limit, q.delayed)]

    def workers(self) -> list[WorkerReport]:
        now = time.time()
        with self._lock:
            for worker_id in [w for w, r in self._reports.items() if r.deadline < now]:
                del self._reports[worker_id]
            return [self._reports[w] for w in sorted(self._reports)]

    def totals(self) -> list[TaskCounts]:
        with self._lock:
            return list(self._totals)

    def close(self) -> None:
        with self._lock:
            self._wake.notify_all()
