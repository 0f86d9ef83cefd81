"""The consumer side of sharded queues (``sharded.py``): one consumer of the inner broker on
every shard of the queues asked for, whose deliveries name the logical queue.

A delivery fetched from shard ``q~K`` is handed out as ``q``'s, its bytes naming ``q`` as
published (``requeued``), with the inner delivery as its receipt; settling it settles that one.
What it publishes goes where ``ShardedBroker.publish`` would send it: a retry back to the shard
it came from, a workflow step's next messages (a chain's next link, a chord's callback) to a
shard of their queue, a unique lock to its queue's first shard. Also what maps a shard's name
and bytes back to its queue's (``logical``, ``requeued``), which ``ShardedBroker`` uses too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ..message import Message
from ..names import SHARD_MARK
from .columns import UniqueLocks
from .consumer import Consumer, Settle, WrappingConsumer
from .records import Delivery, FlowStep, Lock, StoredResult

if TYPE_CHECKING:
    from .sharded import ShardedBroker


class ShardedConsumer(WrappingConsumer):
    """``inner`` (a consumer of ``broker.inner`` on the shards of ``queues``) for ``queues``."""

    def __init__(self, broker: ShardedBroker, queues: tuple[str, ...], inner: Consumer) -> None:
        super().__init__(inner, queues)
        self.broker = broker
        self.combines_ack_and_fetch = inner.combines_ack_and_fetch

    @property
    def cancellations(self) -> bool:
        return self.inner.cancellations

    @cancellations.setter
    def cancellations(self, value: bool) -> None:
        self.inner.cancellations = value

    def _outward(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Inner deliveries as this consumer hands them out: a shard's as its queue's."""
        out = deliveries
        for i, d in enumerate(deliveries):
            queue = logical(d.queue)
            if queue != d.queue:
                if out is deliveries:
                    out = list(deliveries)
                out[i] = Delivery(queue, requeued(d.raw, queue), d)
        return out

    def _routed(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        return tuple(self.broker.route(messages))

    # -- fetching -------------------------------------------------------------------------

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        return self._outward(self.inner.fetch(max_count, timeout))

    def ack_and_fetch(
        self, deliveries: Sequence[Delivery], max_count: int, timeout: float
    ) -> list[Delivery]:
        return self._outward(self.inner.ack_and_fetch(_inner(deliveries), max_count, timeout))

    def prefetch(self, max_count: int) -> None:
        self.inner.prefetch(max_count)

    def take_prefetched(self) -> list[Delivery]:
        return self._outward(self.inner.take_prefetched())

    # -- settling -------------------------------------------------------------------------

    def _settle(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult], last: Settle
    ) -> None:
        """All is ``inner``'s: each delivery as ``inner`` holds it (a shard's)."""
        last(self.inner, _inner(deliveries), results)

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        routed = []
        for step in steps:
            chord = step.chord
            if chord is not None:
                chord = msgspec.structs.replace(chord, callback=self._routed([chord.callback])[0])
            routed.append(
                msgspec.structs.replace(
                    step,
                    delivery=_held(step.delivery),
                    publish=self._routed(step.publish),
                    chord=chord,
                )
            )
        self.inner.ack_flow(routed)

    def retry(self, delivery: Delivery, message: Message) -> None:
        held = _held(delivery)
        if held.queue != delivery.queue and message.queue == delivery.queue:
            message = msgspec.structs.replace(message, queue=held.queue)  # back to its shard
        else:
            message = self._routed([message])[0]
        self.inner.retry(held, message)

    def defer(self, delivery: Delivery, eta: float) -> None:
        self.inner.defer(_held(delivery), eta)

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        self.inner.defer_many([(_held(d), eta) for d, eta in items])

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.inner.dead_letter(_held(delivery), reason)

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        self.inner.dead_letter_many([(_held(d), reason) for d, reason in items])

    def release(self, deliveries: Sequence[Delivery]) -> None:
        self.inner.release(_inner(deliveries))

    # -- unique locks ---------------------------------------------------------------------

    def _locks(self, locks: Sequence[Lock]) -> Sequence[Lock]:
        """``locks``, those of a sharded queue moved to its first shard (where
        ``ShardedBroker.publish_unique`` took them)."""
        stored = self.broker.stored
        if isinstance(locks, UniqueLocks) and stored(locks.queue) == (locks.queue,):
            return locks  # a batch's locks, of a queue not sharded
        if all(stored(lock[0]) == (lock[0],) for lock in locks):
            return locks
        return [(self.broker.lock_shard(q), key, id, until) for q, key, id, until in locks]


def logical(name: str) -> str:
    """The queue that the stored queue ``name`` is a shard of, or ``name`` itself."""
    return name.partition(SHARD_MARK)[0]


def _str_at(raw: bytes, at: int) -> tuple[int, int]:
    """Where the msgpack str at ``raw[at]`` starts and ends; ValueError if it is not one."""
    head = raw[at]
    if 0xA0 <= head <= 0xBF:
        start, size = at + 1, head - 0xA0
    elif head == 0xD9:
        start, size = at + 2, raw[at + 1]
    elif head == 0xDA:
        start, size = at + 3, int.from_bytes(raw[at + 1 : at + 3], "big")
    else:
        raise ValueError(head)
    return start, start + size


def requeued(raw: bytes, queue: str) -> bytes:
    """``raw``, an encoded message (``Message`` is a msgpack array: id, task, queue, ...), with
    ``queue`` in its queue field, every other byte as it was; ``raw`` itself when it is not a
    message's bytes."""
    try:
        if not 0x90 <= raw[0] <= 0x9F and raw[0] != 0xDC:
            return raw
        at = 1 if raw[0] != 0xDC else 3
        at = _str_at(raw, at)[1]  # past the id
        at = _str_at(raw, at)[1]  # past the task
        end = _str_at(raw, at)[1]
    except (ValueError, IndexError):
        return raw
    name = queue.encode()
    head = bytes([0xA0 + len(name)]) if len(name) < 32 else bytes([0xD9, len(name)])
    return raw[:at] + head + name + raw[end:]


def _held(delivery: Delivery) -> Delivery:
    """The inner broker's delivery that ``delivery`` stands for (itself if not a shard's)."""
    receipt = delivery.receipt
    return receipt if type(receipt) is Delivery else delivery


def _inner(deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
    if any(type(d.receipt) is Delivery for d in deliveries):
        return [_held(d) for d in deliveries]
    return deliveries
