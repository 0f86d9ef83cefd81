"""The values that cross the broker contract: a fetched delivery, a stored result, a workflow's
next steps, a queue's figures and a dead letter.

Kept apart from the contract itself (``brokers/base.py``) because every layer above reads them
(the worker, the dashboard, the CLI) while only brokers implement the contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from ..message import Message


class Delivery(msgspec.Struct, gc=False):
    """A message held by one consumer: its queue, its raw bytes and a broker-specific receipt.

    A msgspec ``Struct`` because brokers make one per message on the hot path: it is built
    three times faster than a plain class with ``__slots__``.
    """

    queue: str
    raw: bytes
    receipt: Any


class StoredResult(msgspec.Struct, frozen=True, gc=False):
    """A task's outcome record to keep under its message ``id`` for ``ttl`` seconds.

    ``payload`` is opaque to brokers (``hurtle.middleware.results`` encodes it); a later record
    under the same id replaces the earlier one.
    """

    id: str
    payload: bytes
    ttl: float


#: A unique lock to release: ``(queue, key, message id, until)`` (``Consumer.release_unique``).
Lock = tuple[str, str, str, float]


class ChordStep(msgspec.Struct, frozen=True, gc=False):
    """A chord member's part of a ``FlowStep``: count member ``index`` of chord ``id`` as done.

    ``payload`` (the member's result record, opaque to brokers) is kept at ``index`` of the
    chord's record, which lives ``ttl`` seconds from its last change. The member whose step makes
    ``total`` distinct indexes publishes ``callback``, once: a member counted twice (a message
    delivered twice) counts once, and a chord whose callback was published never publishes again.
    """

    id: str
    index: int
    total: int
    payload: bytes
    ttl: float
    callback: Message


class FlowStep(msgspec.Struct, frozen=True, gc=False):
    """The acknowledgement of one workflow member with everything it sets off, in one step.

    ``Consumer.ack_flow`` applies it only while ``delivery`` is still held by that consumer (a
    copy redelivered elsewhere applies its own): store ``results``, publish ``publish`` (a
    chain's next link), apply ``chord``, drop the chord record named by ``forget`` (a callback
    done with it), and acknowledge ``delivery`` — all or nothing, so that a worker killed at any
    point neither loses the next step nor sets it off twice.
    """

    delivery: Delivery
    results: tuple[StoredResult, ...] = ()
    publish: tuple[Message, ...] = ()
    chord: ChordStep | None = None
    forget: str = ""


class QueueStats(msgspec.Struct, frozen=True):
    """How many messages of one queue are in each state."""

    ready: int = 0
    delayed: int = 0
    in_flight: int = 0
    dead: int = 0
    #: True while the queue is paused (``Broker.pause``): no worker fetches from it.
    paused: bool = False


class DeadLetter(msgspec.Struct, frozen=True):
    """A message that could not be run: why, when, and its bytes exactly as they were received."""

    id: str
    queue: str
    reason: str
    raw: bytes
    failed_at: float

    def message(self) -> Message | None:
        """The decoded message, or ``None`` when the bytes are not a message."""
        try:
            return Message.decode(self.raw)
        except Exception:
            return None


class Ride(NamedTuple):
    """Outcomes a worker's prefetch carries (``Consumer.prefetch_with_acks``): ``deliveries``
    acknowledged, the first ``len(results)`` of them each with its record, then the unique
    ``locks`` they held released, as one flush of the acker would do them."""

    deliveries: list[Delivery]
    results: Sequence[StoredResult] = ()
    locks: Sequence[Lock] = ()
