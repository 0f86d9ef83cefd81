"""``Acker``: gathers the outcomes of processed deliveries and settles them in batches.

Acknowledgements are flushed in one broker call every ``batch_size`` outcomes or every
``interval`` seconds, whichever comes first, from the acker's own thread, so executors never wait
on the network to finish a task. Retries, dead letters and hand-backs (rare) go through the same
thread, in order. Deferrals (throttled messages), and the concurrency slots and unique locks that
settled messages give back, are flushed the same way, each kind in one broker call per flush;
unique locks gathered by the time acknowledgements are flushed go in the acknowledgements' call
(``Consumer.ack_and_release``: one round trip on Redis).

When the broker cannot be reached (a ``BrokerError`` caused by a connection, a timeout or a busy
store), outcomes are kept and retried with backoff, never dropped. ``stop`` keeps retrying so,
with backoff, until everything is settled or its timeout is spent.

Results ride with acknowledgements: ``ack_with_result`` queues a delivery together with its
record (``StoredResult``), and the flush hands both to one ``Consumer.ack`` call; the broker
stores a record only while its delivery is still held (``Consumer.ack``: a worker taken for dead
meanwhile leaves the record to the copy delivered again). Records without a delivery to
acknowledge (``store_result``: a failed attempt, a dead letter) are written first in the flush,
before the retries and dead letters gathered with them. A batch's records come in columns
(``StoredResults``, from ``ack_many_with_results``) and stay so. ``take_ride`` hands what
one acknowledgement call would carry to the solo loop's prefetch (``rides.py``).

What the acker does with an outcome the broker refuses (rather than cannot be reached for), and
with what is still unsettled when ``stop`` gives up, is ``refusals.py``'s.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence, Sized
from typing import Any, TypeVar

from ..brokers import (
    Consumer,
    Delivery,
    FlowStep,
    Lock,
    Ride,
    StoredResult,
    StoredResults,
    UniqueLocks,
)
from ..message import Message
from . import refusals
from .refusals import Ends, Op, unreachable
from .rides import ride_of

log = logging.getLogger(__name__)

T = TypeVar("T")


def _take(pending: deque[T]) -> list[T]:
    """What ``pending`` holds now, taken from the left (other threads append on the right)."""
    take = pending.popleft
    return [take() for _ in range(len(pending))]


class Acker:
    def __init__(
        self, consumer: Consumer, *, batch_size: int = 1000, interval: float = 0.005
    ) -> None:
        self.consumer = consumer
        self.batch_size = batch_size
        #: Plain acknowledgements that wake the thread (never: ``Fetcher.rides``).
        self.wake_at: float = batch_size
        self._taken = self._taken_seen = 0  # calls of ``take_acks``, at the last timed flush
        self.interval = interval
        self._lock = threading.Lock()  # guards _ops
        self._flushing = threading.Lock()  # one flush at a time
        # appended to by executor threads without a lock (deque.append is atomic), drained by
        # whoever flushes: the hot path pays one append and one length check per task
        self._acks: deque[Delivery] = deque()
        # likewise: acknowledgements that carry a result, and records to store on their own
        self._with_results: deque[tuple[Delivery, StoredResult]] = deque()
        # a batch's acknowledgements with its records in columns (``StoredResults``), as
        # ``after_calls`` makes them; and how many records they hold (both under ``_lock``)
        self._result_batches: deque[tuple[list[Delivery], StoredResults]] = deque()
        self._batched = 0
        self._records: list[StoredResult] = []
        # workflow members: acknowledged with what they set off, in one call per flush
        self._flows: deque[FlowStep] = deque()
        self._ops: list[Op] = []
        # deferrals and what limits give back: (delivery, eta), (key, slots), (queue, key, id)
        self._defers: deque[tuple[Delivery, float]] = deque()
        self._slots: deque[tuple[str, int]] = deque()
        self._uniques: deque[Lock] = deque()
        # the locks of messages about to become dead letters: ended before any dead letter of
        # the flush, so that no one sees a dead letter whose lock still holds
        self._ending: deque[Lock] = deque()
        # and a batch's locks in columns (``UniqueLocks``), as ``after_calls`` makes them
        self._lock_batches: deque[UniqueLocks] = deque()
        #: dead letters recorded together, one broker call per flush: (delivery, reason)
        self._dead: deque[tuple[Delivery, str]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._deadline = 0.0
        self._thread = threading.Thread(target=self._run, name="hurtle-acker", daemon=True)
        #: Outcomes settled so far (acks, retries, dead letters).
        self.settled = 0
        #: Flushes in a row that left outcomes unsettled.
        self.failures = 0
        #: Outcomes given up on (refused by the broker, or unsettled when ``stop`` gave up).
        self.dropped = 0
        #: What ends with a retry the broker refuses, which becomes a dead letter (set by the
        #: worker: ``Processor.ends_of``).
        self.ends: Ends | None = None

    def start(self) -> None:
        self._thread.start()

    def ack(self, delivery: Delivery) -> None:
        acks = self._acks
        acks.append(delivery)
        if len(acks) == self.wake_at:
            self._wake.set()

    def ack_many(self, deliveries: list[Delivery]) -> None:
        acks = self._acks
        acks.extend(deliveries)
        if len(acks) >= self.wake_at:
            self._wake.set()

    def ack_with_result(
        self, delivery: Delivery, message_id: str, payload: bytes, ttl: float
    ) -> None:
        """Acknowledge ``delivery`` and store ``payload`` as the result of ``message_id`` for
        ``ttl`` seconds, in the same broker call as the batch's other acknowledgements."""
        pending = self._with_results
        pending.append((delivery, StoredResult(message_id, payload, ttl)))
        if len(pending) == self.wake_at:
            self._wake.set()

    def ack_flow(self, step: FlowStep) -> None:
        """Acknowledge a workflow member with what it sets off (``Consumer.ack_flow``), in one
        broker call per flush for all of them."""
        self._flows.append(step)
        self._wake.set()

    def ack_flows(self, steps: list[FlowStep]) -> None:
        """``ack_flow`` for a batch's workflow members: one broker call for them, woken once."""
        self._flows.extend(steps)
        self._wake.set()

    def ack_many_with_results(
        self, deliveries: list[Delivery], results: Sequence[StoredResult]
    ) -> None:
        """``ack_with_result`` for a batch: ``results[i]`` rides with ``deliveries[i]``."""
        if isinstance(results, StoredResults):  # kept in columns: no object per record
            if len(results) != len(deliveries):
                raise ValueError(f"{len(results)} results for {len(deliveries)} deliveries")
            with self._lock:
                self._result_batches.append((deliveries, results))
                self._batched += len(results)
                full = self._batched >= self.wake_at
            if full:
                self._wake.set()
            return
        pending = self._with_results
        pending.extend(zip(deliveries, results, strict=True))
        if len(pending) >= self.wake_at:
            self._wake.set()

    def store_result(self, message_id: str, payload: bytes, ttl: float) -> None:
        """Store a record with nothing to acknowledge (a failed attempt), in the next flush."""
        with self._lock:
            self._records.append(StoredResult(message_id, payload, ttl))
        self._wake.set()

    def take_acks(self) -> list[Delivery]:
        """Take the acknowledgements gathered so far, for the caller to record itself."""
        with self._flushing:
            self._taken += 1
            return _take(self._acks)

    def _loop_takes(self) -> bool:
        """Whether a timed flush leaves plain acknowledgements to the solo loop's prefetches
        (``wake_at`` infinite): it took some since the last one. A loop that stalls leaves
        them to the flush after (two ``interval`` at most)."""
        if self.wake_at != math.inf or self._stopping:
            return False
        taking, self._taken_seen = self._taken != self._taken_seen, self._taken
        return taking

    def take_ride(self) -> Ride:
        """What a flush's acknowledgement call would carry, for the solo loop's prefetch to
        carry instead (``Fetcher.rides``; ``rides.give_back`` if it was not)."""
        with self._flushing:
            self._taken += 1
            with self._lock:
                batches = list(self._result_batches)
                self._result_batches.clear()
                self._batched = 0
            acks, with_results = _take(self._acks), _take(self._with_results)
            loose, batched = _take(self._uniques), _take(self._lock_batches)
        return ride_of(acks, with_results, batches, loose, batched)

    def give_back(self, acks: list[Delivery]) -> None:
        """Return acknowledgements taken with ``take_acks`` that could not be recorded."""
        self._acks.extendleft(reversed(acks))

    def retry(self, delivery: Delivery, message: Message) -> None:
        self._op(Op("retry", [delivery], message))

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._op(Op("dead", [delivery], reason))

    def dead_letter_many(self, items: list[tuple[Delivery, str]]) -> None:
        """Dead-letter each ``(delivery, reason)`` with the next flush, all of the flush's in
        one broker call (messages not run: expired, cancelled)."""
        self._dead.extend(items)
        self._wake.set()

    def release(self, deliveries: list[Delivery]) -> None:
        if deliveries:
            self._op(Op("release", list(deliveries)))

    def defer(self, delivery: Delivery, eta: float) -> None:
        """Put a held delivery back unchanged, due at ``eta`` (a throttled message)."""
        self._defers.append((delivery, eta))
        self._wake.set()

    def release_slots(self, key: str, count: int) -> None:
        """Give back ``count`` concurrency slots of ``key`` with the next flush."""
        self._slots.append((key, count))
        self._wake.set()

    def release_unique(self, queue: str, key: str, message_id: str, until: float) -> None:
        """End the unique lock of a settled message with the next flush (``until``: when it
        ends at the latest, ``Consumer.release_unique``)."""
        self._uniques.append((queue, key, message_id, until))

    def release_unique_batch(self, locks: UniqueLocks) -> None:
        """``release_uniques`` for the locks of a batch, in columns (``UniqueLocks``)."""
        if locks:
            self._lock_batches.append(locks)

    def end_unique(self, queue: str, key: str, message_id: str, until: float) -> None:
        """End the unique lock of a message about to become a dead letter, in the next flush,
        before that flush writes any dead letter."""
        self._ending.append((queue, key, message_id, until))

    def release_uniques(self, locks: list[Lock]) -> None:
        """``release_unique`` for a batch of (queue, lock, message id, until)."""
        self._uniques.extend(locks)

    def _op(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:  # (``_lock_batches``: batches of locks the acker still gives back)
            queues: tuple[Sized, ...] = (self._acks, self._with_results, self._records)
            queues += (self._flows, self._ops, self._defers, self._slots, self._uniques)
            queues += (self._ending, self._lock_batches, self._dead)
            return self._batched + sum(map(len, queues))

    @property
    def stopping(self) -> bool:
        return self._stopping

    def flush(self, timed: bool = False) -> bool:
        """Settle everything gathered so far, now, from the calling thread; False when some
        outcomes are left for later (the broker could not be reached, or refused some).
        ``timed``: the thread's flush every ``interval`` (see ``_loop_takes``)."""
        with self._flushing:
            ok = self._flush(timed and self._loop_takes())
        self.failures = 0 if ok else self.failures + 1
        return ok

    def _flush(self, leave_acks: bool = False) -> bool:
        with self._lock:
            ops, self._ops = self._ops, []
            records, self._records = self._records, []
            batches = [] if leave_acks else list(self._result_batches)
            if not leave_acks:
                self._result_batches.clear()
                self._batched = 0
        pending = self._acks
        acks = [] if leave_acks else _take(pending)
        pending_results = self._with_results
        with_results = [] if leave_acks else _take(pending_results)
        kept: list[Op] = []  # to try again, in order
        error: Exception | None = None  # why the broker could not be reached
        settled = 0
        if records:
            error = refusals.store_records(
                self.consumer, records, "; their handles will not see these failures"
            )
            if error is not None:
                kept, ops = ops, []
                with self._lock:
                    self._records[:0] = records
        if self._ending and error is None:
            ending = _take(self._ending)
            try:
                self.consumer.release_unique(ending)
            except Exception as err:
                if unreachable(err):  # no dead letter before its lock ends: both wait
                    error = err
                    kept, ops = kept + ops, []
                    self._ending.extendleft(reversed(ending))
                else:
                    self.dropped += len(ending)
                    log.error("the broker refused to end %d unique locks (%s)", len(ending), err)
        for i, op in enumerate(ops):
            try:
                op.apply(self.consumer)
            except Exception as err:
                if unreachable(err):
                    error = err
                    kept += ops[i:]
                    break
                if not self._refused(op, err):
                    kept.append(op)
                continue
            settled += 1
        if (acks or with_results or batches) and error is None:
            # the unique locks gathered so far go in the same call (most are these messages')
            uniques, lock_batches = self._uniques, self._lock_batches
            loose, batched_locks = _take(uniques), _take(lock_batches)
            delivered, stored, locks = ride_of(acks, with_results, batches, loose, batched_locks)
            try:
                if locks:
                    self.consumer.ack_and_release(delivered, stored, locks)
                elif stored:
                    self.consumer.ack(delivered, stored)
                else:
                    self.consumer.ack(delivered)
            except Exception as err:
                uniques.extendleft(reversed(loose))  # released on their own, below
                lock_batches.extendleft(reversed(batched_locks))
                if unreachable(err):
                    error = err
                else:
                    with_results += [p for ds, rs in batches for p in zip(ds, rs, strict=True)]
                    batches = []
                    acks, with_results, done, dropped = refusals.acks_one_by_one(
                        self.consumer, acks, with_results, err
                    )
                    self.settled += done
                    self.dropped += dropped
            else:
                settled += len(acks) + len(with_results) + sum(len(ds) for ds, _ in batches)
                acks = []
                with_results = []
                batches = []
        if kept or acks or with_results or batches:
            with self._lock:  # put back in front, in order
                self._ops[:0] = kept
                self._result_batches.extendleft(reversed(batches))
                self._batched += sum(len(rs) for _, rs in batches)
            pending.extendleft(reversed(acks))
            pending_results.extendleft(reversed(with_results))
        if error is None and self._flows:
            settled += self._flush_flows()
        if error is None:
            settled += self._flush_limits(leave_acks)
        self.settled += settled
        if error is not None:
            log.warning(
                "could not settle %d outcomes, will retry: %s",
                len(kept) + len(acks) + len(with_results) + sum(len(ds) for ds, _ in batches),
                error,
            )
        return (
            not kept
            and not acks
            and not with_results
            and not batches
            and not self._defers
            and not self._flows
            and not self._dead
            and not self._ending
        )

    def _flush_flows(self) -> int:
        """Workflow members, in one ``ack_flow`` call; kept for later when the broker cannot
        be reached. One the broker refuses stays held by this worker, which runs it again
        once its session closes (its workflow's next step is then set off by that run)."""
        pending = self._flows
        steps = _take(pending)
        try:
            self.consumer.ack_flow(steps)
        except Exception as err:
            if unreachable(err):
                pending.extendleft(reversed(steps))
                log.warning("could not settle %d workflow steps, will retry: %s", len(steps), err)
                return 0
            again, settled, dropped = refusals.ack_flows_one_by_one(self.consumer, steps)
            pending.extendleft(reversed(again))
            self.dropped += dropped
            return settled
        return len(steps)

    def _flush_limits(self, leave_locks: bool = False) -> int:
        """Gathered dead letters, deferrals, then slots and unique locks given back: one broker
        call per kind.

        Kept for later when the broker cannot be reached; given up on when it refuses (a
        dead-lettered or deferred delivery is then still held and goes back when the session
        closes; slots and locks end by themselves with the worker's deadline or
        ``unique_for``)."""
        settled = 0
        if self._dead:  # records handed over since this flush began go before the dead letters
            with self._lock:
                records, self._records = self._records, []
            if records and (err := refusals.store_records(self.consumer, records)) is not None:
                with self._lock:  # no dead letter before its record: both wait
                    self._records[:0] = records
                log.warning("could not store %d records, will retry: %s", len(records), err)
                return settled
        calls = (
            (self._ending, self.consumer.release_unique, "unique locks of dead letters ended"),
            (self._dead, self.consumer.dead_letter_many, "dead letters"),
            (self._defers, self.consumer.defer_many, "deferrals"),
            (self._slots, self.consumer.release_slots, "concurrency slots given back"),
            (self._uniques, self.consumer.release_unique, "unique locks released"),
            (self._lock_batches, self._release_batches, "batches of unique locks released"),
        )
        for pending, call, what in calls:
            if not pending or (leave_locks and pending in (self._uniques, self._lock_batches)):
                continue  # (left to the loop's ride, as the acknowledgements they go with)
            items: list[Any] = _take(pending)
            try:
                call(items)
            except Exception as err:
                if unreachable(err):
                    pending.extendleft(reversed(items))
                    log.warning("could not flush %d %s, will retry: %s", len(items), what, err)
                    return settled
                self.dropped += len(items)
                log.error("the broker refused %d %s (%s): giving up on them", len(items), what, err)
                continue
            if pending is self._defers or pending is self._dead:
                settled += len(items)
        return settled

    def _release_batches(self, batches: list[UniqueLocks]) -> None:
        self.consumer.release_unique(UniqueLocks.join(batches))

    def _refused(self, op: Op, err: Exception) -> bool:
        """Handle an outcome the broker refused; True when it is off the acker's hands."""
        verdict = refusals.refused(self.consumer, op, err, self.ends)
        self.settled += verdict.settled
        self.dropped += verdict.dropped
        if verdict.later is not None:
            with self._lock:
                self._ops.append(verdict.later)  # settled once the broker is back
        return verdict.done

    def _run(self) -> None:
        backoff = self.interval
        was_stopping = False
        while True:
            self._wake.wait(backoff)
            self._wake.clear()
            stopping = self._stopping
            if stopping and not was_stopping:  # the shutdown's tries start short again
                was_stopping = True
                backoff = self.interval
            if self.flush(timed=True):
                backoff = self.interval
            else:
                backoff = min(max(backoff * 2, 0.05), 2.0)
            if stopping:
                left = self._deadline - time.monotonic()
                if not self.pending or left <= 0:
                    return
                backoff = min(backoff, left)

    def stop(self, timeout: float = 10.0) -> None:
        """Settle what is left, retrying with backoff until done or ``timeout`` is spent; then
        stop the thread. What could not be settled is logged as an error, with the counts."""
        self._deadline = time.monotonic() + timeout
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout + 1.0)
        else:
            backoff = self.interval
            while not self.flush():
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(backoff, left))
                backoff = min(max(backoff * 2, 0.05), 2.0)
        with self._lock:
            acks = len(self._acks) + len(self._with_results) + self._batched + len(self._flows)
            ops = list(self._ops)
        self.dropped += refusals.give_up(acks, ops, len(self._defers), timeout)
