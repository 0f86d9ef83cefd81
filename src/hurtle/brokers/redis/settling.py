"""How a ``RedisConsumer`` settles what it took: acknowledgements (with results), retries, dead
letters, deferrals and hand-backs, each kind in one script call per queue and one round trip
per batch."""

from __future__ import annotations

import math
import struct
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import lru_cache
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ...errors import EncodeError
from ...ids import new_id
from ...message import MAX_PRIORITY, Message, message_id
from ..columns import ResultBatch, StoredResults
from ..common import log_trimmed
from ..keys import BATCH_BITS, BATCH_MASK, QUEUES, RESULTS_CHANNEL
from ..records import Delivery, FlowStep, StoredResult
from . import flows
from .results import _head, _results_commands, _Write, _writes
from .scripts import _PRIORITY_ARG, RAW, _Command, _publish_keys

if TYPE_CHECKING:
    from .broker import RedisBroker
    from .consumer import _Target


def _unstorable(message: Message) -> str | None:
    """Why ``message`` cannot be stored as a retry (a field out of range), or ``None``."""
    priority = message.priority
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        return (
            f"priority {priority!r} of task {message.task!r} is out of range (an int from 0 "
            f"to {MAX_PRIORITY})"
        )
    if not math.isfinite(message.eta):
        return f"eta {message.eta!r} of task {message.task!r} is not a finite time"
    return None


@lru_cache(maxsize=64)
def _packed_range(start: int, n: int) -> bytes:
    return struct.pack(f"<{n}I", *range(start, start + n))


_QUEUE_OF = attrgetter("queue")
_RECEIPT_OF = attrgetter("receipt")


def _ack_args(receipts: list[int]) -> list[Any]:
    """``ack.lua`` arguments: per batch its id, a count and the packed message indexes."""
    first, n = receipts[0], len(receipts)
    if (
        receipts[-1] - first == n - 1
        and first >> BATCH_BITS == receipts[-1] >> BATCH_BITS
        and receipts == list(range(first, first + n))
    ):  # the usual case: a run of one fetched batch, in order
        return [first >> BATCH_BITS, n, _packed_range(first & BATCH_MASK, n)]
    args: list[Any] = []
    if receipts == sorted(receipts):
        # the next usual case: runs of fetched batches, in order (a flush that took the end of
        # one batch and the start of the next): each run packed whole, no look at each receipt
        start = 0
        while start < n:
            first = receipts[start]
            batch = first >> BATCH_BITS
            end = bisect_left(receipts, (batch + 1) << BATCH_BITS, start)
            if receipts[end - 1] - first != end - start - 1 or receipts[start:end] != list(
                range(first, first + end - start)
            ):
                break  # a receipt twice: the general way below
            args += (batch, end - start, _packed_range(first & BATCH_MASK, end - start))
            start = end
        else:
            return args
        args = []
    unique = set(receipts)
    ordered = sorted(unique) if len(unique) != len(receipts) else sorted(receipts)
    n = len(ordered)
    start = 0
    while start < n:
        batch = ordered[start] >> BATCH_BITS
        end = bisect_left(ordered, (batch + 1) << BATCH_BITS, start)
        indexes = [r & BATCH_MASK for r in ordered[start:end]]
        args += (batch, end - start, struct.pack(f"<{end - start}I", *indexes))
        start = end
    return args


def _segments(deliveries: Sequence[Delivery]) -> list[tuple[str, int, int, int]]:
    """``deliveries`` cut in runs delivered by one batch of one queue: (queue, batch id, start,
    end). The usual flush, one queue and one batch, is found without a look at each delivery."""
    receipts = list(map(_RECEIPT_OF, deliveries))
    queues = set(map(_QUEUE_OF, deliveries))
    n = len(receipts)
    if len(queues) == 1:
        queue = queues.pop()
        low, high = min(receipts) >> BATCH_BITS, max(receipts) >> BATCH_BITS
        if low == high:
            return [(queue, low, 0, n)]
        if receipts == sorted(receipts):  # batches in the order they were fetched
            out = []
            start = 0
            while start < n:
                batch = receipts[start] >> BATCH_BITS
                end = bisect_left(receipts, (batch + 1) << BATCH_BITS, start)
                out.append((queue, batch, start, end))
                start = end
            return out
    out = []
    start = 0
    for i in range(1, n + 1):
        if (
            i == n
            or deliveries[i].queue != deliveries[start].queue
            or receipts[i] >> BATCH_BITS != receipts[start] >> BATCH_BITS
        ):
            out.append((deliveries[start].queue, receipts[start] >> BATCH_BITS, start, i))
            start = i
    return out


def _part(results: Sequence[StoredResult], start: int, end: int) -> Sequence[StoredResult]:
    """Records ``start`` to ``end`` of ``results``; a worker's batches stored whole stay so
    where they lie within, and one cut by the bounds is stored one record at a time."""
    if not isinstance(results, StoredResults) or results.batches is None:
        return results[start:end]
    kept: list[ResultBatch] = []
    at = 0
    for b in results.batches:
        low, high = max(start, at), min(end, at + b.size)
        if low < high:
            if high - low == b.size:
                kept.append(b)
            else:
                kept.append(ResultBatch(high - low, b"", _cut(b, low - at, high - at)))
        at += b.size
    return StoredResults(results.ids[start:end], None, results.ttl, kept)


def _cut(batch: ResultBatch, low: int, high: int) -> Callable[[], list[bytes]]:
    return lambda: batch.payloads()[low:high]


def _ack_results_call(
    broker: RedisBroker,
    inflight: str,
    receipts: list[int],
    writes: list[tuple[int, _Write]],
    announced: str,
) -> _Command:
    """``ack_results.lua`` for one queue: its acknowledgements and the records riding with
    them, packed here (``_head``) when the records are."""
    acks = _ack_args(receipts)
    script = broker._scripts.ack_results
    keys = [inflight, *(w.name for _, w in writes)]
    args: list[Any] = [len(acks) // 3, *acks, RESULTS_CHANNEL, announced, len(writes)]
    for batch, w in writes:
        args += (batch, w.ttl_ms, w.size)
    if not any(isinstance(w.body, bytes) for _, w in writes):
        for _, w in writes:
            args += w.body
        return broker._call(script, keys, args)
    head = ("EVALSHA", script.sha, len(keys), *keys, *args)
    bodies = [w.body if isinstance(w.body, bytes) else _pairs_of(w.body) for _, w in writes]
    more = sum(2 * w.size for _, w in writes)
    return (RAW, _head(head, more) + b"".join(bodies)), script


def _pairs_of(fields: list[Any]) -> bytes:
    """``fields`` as the RESP bulk strings ``_head`` announces."""
    packed = _head(fields, 0)
    return packed[packed.index(b"\r\n") + 2 :]


class _Settling:
    """``RedisConsumer``'s acknowledgements, retries, dead letters, deferrals and hand-backs."""

    broker: RedisBroker

    def _target(self, queue: str) -> _Target:
        raise NotImplementedError

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        if not deliveries and not results:
            return
        self.broker._pipeline_raw(
            self._ack_commands(deliveries, results),
            f"acknowledging {len(deliveries)} deliveries",
        )

    def _ack_commands(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult]
    ) -> list[_Command]:
        queues = set(map(_QUEUE_OF, deliveries))
        if len(queues) <= 1:
            groups = {queues.pop(): list(map(_RECEIPT_OF, deliveries))} if queues else {}
        else:
            groups = {}
            for d in deliveries:
                groups.setdefault(d.queue, []).append(d.receipt)
        script = self.broker._scripts.ack
        riding: Sequence[StoredResult] = results
        commands: list[_Command] = []
        if len(results) > len(deliveries):  # records past the deliveries ride with none
            loose = list(results)
            riding, loose = loose[: len(deliveries)], loose[len(deliveries) :]
            commands += _results_commands(self.broker, loose)
        writes = self._riding_writes(deliveries, riding) if riding else {}
        for q, receipts in groups.items():
            inflight = self._target(q).inflight
            if q in writes:
                commands.append(_ack_results_call(self.broker, inflight, receipts, *writes[q]))
            else:
                commands.append(self.broker._call(script, (inflight,), _ack_args(receipts)))
        return commands

    def _riding_writes(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult]
    ) -> dict[str, tuple[list[tuple[int, _Write]], str]]:
        """Per queue, the writes of the records that ride with its deliveries, each with the
        id of the batch that delivered its messages (``ack_results.lua`` writes it only while
        that batch is held), and the ids to announce."""
        now_ms = self.broker._server_ms()
        out: dict[str, tuple[list[tuple[int, _Write]], str]] = {}
        for queue, batch, start, end in _segments(deliveries[: len(results)]):
            part = results if end - start == len(results) else _part(results, start, end)
            writes, announced = _writes(self.broker, part, now_ms)
            had = out.get(queue)
            if had is None:
                out[queue] = ([(batch, w) for w in writes], announced)
            else:
                had[0].extend((batch, w) for w in writes)
                out[queue] = (had[0], f"{had[1]} {announced}")
        return out

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        flows.ack_flow(self, steps)

    def retry(self, delivery: Delivery, message: Message) -> None:
        problem = _unstorable(message)
        if problem is None:
            try:
                raw = message.encode()
            except EncodeError as err:
                problem = str(err)
        if problem is not None:
            # Raising would fail this delivery the same way at every try, for ever.
            reason = f"cannot store the next attempt: {problem}; this is the message as delivered"
            self.dead_letter_many([(delivery, reason)])
            return
        b = self.broker
        source = self._target(delivery.queue)
        batch, index = delivery.receipt >> BATCH_BITS, delivery.receipt & BATCH_MASK
        doing = f"scheduling a retry of a message of {delivery.queue!r}"
        if message.queue == delivery.queue:
            k = source.keys
            b._eval(
                b._scripts.retry,
                (*k.ready, k.delayed, source.inflight, k.wake, k.seq),
                (batch, index, message.priority, repr(float(message.eta)), raw),
                doing,
            )
            return
        # Another queue is another hash tag, so no one script can move the message: check that
        # this worker still holds it, store the new attempt, and settle the delivery only once
        # that succeeded (three round trips, on a rare path). A failure in between leaves the
        # message in both queues, to run twice, never in neither.
        if not b._eval(b._scripts.held, (source.inflight,), (batch, index), doing):
            return  # settled already, or recovered: the copy in the queue is the one that lives
        args: list[Any] = [0] * (MAX_PRIORITY + 1)
        if message.eta > time.time():
            args += [message.eta, _PRIORITY_ARG[message.priority], raw]
        else:
            args[message.priority] = 1
            args.append(raw)
        b._publishing(
            [
                (("SADD", QUEUES, message.queue), None),
                b._call(b._scripts.publish, _publish_keys(message.queue), args),
            ],
            doing,
        )
        b._eval(b._scripts.ack, (source.inflight,), _ack_args([delivery.receipt]), doing)

    def _dead_letter_call(
        self, delivery: Delivery, reason: str
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """The keys and arguments of ``dead_letter.lua`` for one delivery."""
        target = self._target(delivery.queue)
        k = target.keys
        receipt = delivery.receipt
        b = self.broker
        return (target.inflight, k.dead, k.dead_raw, k.dead_reason), (
            receipt >> BATCH_BITS,
            receipt & BATCH_MASK,
            new_id(),
            reason,
            delivery.raw,
            repr(b.dead_letter_ttl),
            b.dead_letter_max,
            b._dead_index,
            message_id(delivery.raw),
            delivery.queue,
        )

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        """``dead_letter.lua`` per delivery, pipelined: one round trip for them all."""
        if not items:
            return
        b = self.broker
        script = b._scripts.dead_letter
        commands = [b._call(script, *self._dead_letter_call(d, reason)) for d, reason in items]
        doing = f"dead-lettering {len(items)} messages"
        results = b._pipeline(commands, doing)
        trimmed: dict[str, tuple[int, int]] = {}
        changes = []  # of the dead-letter index, on a cluster (deadletters.py)
        for (delivery, _), (_, expired, dropped, *changed) in zip(items, results, strict=True):
            was = trimmed.get(delivery.queue, (0, 0))
            trimmed[delivery.queue] = (was[0] + expired, was[1] + dropped)
            changes += changed
        b._index_dead(changes, doing)
        for queue, (expired, dropped) in trimmed.items():
            log_trimmed(b, queue, expired, dropped)

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        """Each delivery goes back as it is (``retry.lua`` with its own bytes), one round trip."""
        if not items:
            return
        b = self.broker
        commands = []
        for delivery, eta in items:
            k = self._target(delivery.queue)
            batch, index = delivery.receipt >> BATCH_BITS, delivery.receipt & BATCH_MASK
            commands.append(
                b._call(
                    b._scripts.retry,
                    (*k.keys.ready, k.keys.delayed, k.inflight, k.keys.wake, k.keys.seq),
                    (batch, index, batch % 10, repr(float(eta)), delivery.raw),
                )
            )
        b._pipeline(commands, f"deferring {len(items)} deliveries")

    def release(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        by_queue: dict[str, list[Any]] = {}
        for d in deliveries:
            by_queue.setdefault(d.queue, []).extend(
                (d.receipt >> BATCH_BITS, d.receipt & BATCH_MASK, d.raw)
            )
        script = self.broker._scripts.release
        commands = []
        for queue, triples in by_queue.items():
            target = self._target(queue)
            k = target.keys
            commands.append(self.broker._call(script, (*k.ready, target.inflight, k.wake), triples))
        self.broker._pipeline(commands, f"releasing {len(deliveries)} deliveries")
