"""The consumer of ``memory://`` (``MemoryBroker.consumer``): what one worker holds and settles.

It works on its broker's store under the broker's lock: the messages it took (``_held``, by
receipt), their acknowledgements with results and workflow steps, retries, dead letters,
deferrals, concurrency slots and unique locks, and its heartbeat deadline, which the broker's
recovery checks. The store itself, and what every client reads, is ``memory.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from ..ids import new_id
from ..message import MAX_PRIORITY, Message
from .base import Consumer
from .common import flow_items, log_trimmed
from .records import DeadLetter, Delivery, FlowStep, Lock, StoredResult
from .reports import WorkerReport, merge

if TYPE_CHECKING:
    from .memory import MemoryBroker


class MemoryConsumer(Consumer):
    def __init__(self, broker: MemoryBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        self.heartbeat_timeout = broker.heartbeat_timeout
        with broker._lock:
            broker._held.setdefault(worker_id, {})
            broker._deadline[worker_id] = time.time() + self.heartbeat_timeout

    def _held(self) -> dict[int, tuple[str, bytes, int]]:
        held = self.broker._held.get(self.worker_id)
        if held is None:  # declared dead while alive: start over under the same id
            held = self.broker._held[self.worker_id] = {}
            # and be known again, or what it takes now is never recovered if it dies
            self.broker._deadline.setdefault(self.worker_id, time.time() + self.heartbeat_timeout)
        return held

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        b = self.broker
        deadline = time.monotonic() + timeout
        with b._lock:
            while True:
                now = time.time()
                out: list[Delivery] = []
                held = self._held()
                paused = b._paused
                for name in self.queues:
                    q = b._queues.get(name)
                    if q is None or (paused and name in paused):
                        continue
                    b._promote_locked(q, now)
                    start = len(out)
                    for priority in range(MAX_PRIORITY, -1, -1):
                        level = q.ready[priority]
                        while level and len(out) < max_count:
                            raw = level.popleft()
                            receipt = next(b._seq)
                            held[receipt] = (name, raw, priority)
                            out.append(Delivery(name, raw, receipt))
                    if len(out) >= max_count or _took_probe(q.last_probe, out, start):
                        break  # full, or one let out of quarantine: no other queue's with it
                if out:
                    self.cancellations = b._cancel_until > now
                    return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return out
                eta = b._next_eta_locked(self.queues)
                if eta is not None:
                    left = min(left, max(eta - now, 0.001))
                b._wake.wait(left)

    def _take(self, delivery: Delivery) -> tuple[str, bytes, int] | None:
        return self._held().pop(delivery.receipt, None)

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        wakes: list[Callable[[], None]] = []
        with self.broker._lock:
            held = self._held()
            if results:
                n = min(len(results), len(deliveries))
                if any(d.receipt not in held for d in deliveries[:n]):
                    # taken for dead meanwhile: the copies delivered again keep their records
                    results = [
                        r for i, r in enumerate(results) if i >= n or deliveries[i].receipt in held
                    ]
                wakes = self.broker._store_results_locked(results)
            for d in deliveries:
                held.pop(d.receipt, None)
        for wake in wakes:
            wake()

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        # encoded first: a message that cannot be encoded settles nothing
        encoded = flow_items(steps, _encoded)
        b = self.broker
        wakes: list[Callable[[], None]] = []
        with b._lock:
            held = self._held()
            now = time.time()
            for step, (publish, callback) in zip(steps, encoded, strict=True):
                if step.delivery.receipt not in held:
                    continue  # settled already, or recovered: the live copy sets it off
                if step.results:
                    wakes += b._store_results_locked(step.results)
                for m, raw in publish:
                    b._put(m.queue, raw, m.priority, m.eta)
                chord = step.chord
                if chord is not None and b._chord_step_locked(chord, now):
                    assert callback is not None
                    c, raw = callback
                    b._put(c.queue, raw, c.priority, c.eta)
                if step.forget:
                    b._chords.pop(step.forget, None)
                del held[step.delivery.receipt]
            b._wake.notify_all()
        for wake in wakes:
            wake()

    def retry(self, delivery: Delivery, message: Message) -> None:
        raw = message.encode()
        b = self.broker
        with b._lock:
            if self._take(delivery) is None:
                return  # settled already, or recovered: the copy in the queue is the one alive
            b._put(message.queue, raw, message.priority, message.eta)
            b._wake.notify_all()

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.dead_letter_many([(delivery, reason)])

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        b = self.broker
        trimmed: dict[str, tuple[int, int]] = {}
        with b._lock:
            now = time.time()
            for delivery, reason in items:
                if self._take(delivery) is None:
                    continue  # settled already, or recovered: the copy in the queue lives
                q = b._queue(delivery.queue)
                b._add_dead_locked(
                    q,
                    DeadLetter(
                        id=new_id(),
                        queue=delivery.queue,
                        reason=reason,
                        raw=delivery.raw,
                        failed_at=now,
                    ),
                )
                expired, dropped = b._trim_dead_locked(q, now)
                was = trimmed.get(delivery.queue, (0, 0))
                trimmed[delivery.queue] = (was[0] + expired, was[1] + dropped)
        for queue, (expired, dropped) in trimmed.items():
            log_trimmed(b, queue, expired, dropped)

    def defer(self, delivery: Delivery, eta: float) -> None:
        b = self.broker
        with b._lock:
            held = self._take(delivery)
            if held is None:
                return  # settled already, or recovered: the copy in the queue is the one alive
            queue, raw, priority = held
            b._put(queue, raw, priority, eta)
            b._wake.notify_all()

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        b = self.broker
        out = []
        with b._lock:
            self._held()  # known again if declared dead meanwhile
            now = time.time()
            for key, limit, wanted in requests:
                holders = b._slots.setdefault(key, {})
                for worker in [w for w in holders if b._deadline.get(w, 0.0) < now]:
                    del holders[worker]
                granted = max(0, min(wanted, limit - sum(holders.values())))
                if granted:
                    holders[self.worker_id] = holders.get(self.worker_id, 0) + granted
                out.append(granted)
        return out

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        b = self.broker
        with b._lock:
            for key, count in releases:
                holders = b._slots.get(key, {})
                left = holders.get(self.worker_id, 0) - count
                if left > 0:
                    holders[self.worker_id] = left
                else:
                    holders.pop(self.worker_id, None)

    def release_unique(self, locks: Sequence[Lock]) -> None:
        b = self.broker
        with b._lock:
            for queue, key, message_id, _ in locks:
                held = b._unique.get((queue, key))
                if held is not None and held[0] == message_id:
                    del b._unique[(queue, key)]

    def release(self, deliveries: Sequence[Delivery]) -> None:
        b = self.broker
        with b._lock:
            items = [x for x in (self._take(d) for d in reversed(deliveries)) if x is not None]
            b._requeue_locked(items)
            b._wake.notify_all()

    def heartbeat(self) -> bool:
        b = self.broker
        with self._reporting() as report, b._lock:
            now = time.time()
            deadline = b._deadline[self.worker_id] = now + self.heartbeat_timeout
            if report is not None:
                self._store_report_locked(report, now, deadline)
            self._held()
            b._recover_locked()
            return any(q.quarantine for q in b._queues.values())

    def send_report(self) -> None:
        b = self.broker
        with self._reporting() as report:
            if report is not None:
                with b._lock:
                    now = time.time()
                    self._store_report_locked(report, now, now + self.heartbeat_timeout)

    def _store_report_locked(self, report: WorkerReport, now: float, deadline: float) -> None:
        b = self.broker
        for gone in [w for w, r in b._reports.items() if r.deadline < now]:
            del b._reports[gone]
        b._reports[self.worker_id] = msgspec.structs.replace(report, delta=(), deadline=deadline)
        if report.delta:
            b._totals = merge([*b._totals, *report.delta])

    def close(self) -> None:
        b = self.broker
        with self._reporting() as report, b._lock:
            b._requeue_locked(b._held.pop(self.worker_id, {}).values())
            b._deadline.pop(self.worker_id, None)
            if report is not None:  # leaves with its last counts in the totals
                b._reports.pop(self.worker_id, None)
                if report.delta:
                    b._totals = merge([*b._totals, *report.delta])
            b._wake.notify_all()


def _took_probe(probe: tuple[int, bytes] | None, out: list[Delivery], start: int) -> bool:
    """Whether ``out[start:]``, taken from one queue, holds ``probe``, the last message its
    queue let out of quarantine (None once that one was taken: the common case, no search)."""
    return probe is not None and any(d.raw is probe[1] for d in out[start:])


def _encoded(m: Message) -> tuple[Message, bytes]:
    return m, m.encode()
