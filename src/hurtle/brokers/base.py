"""The broker contract: what every broker implements, batch-first.

Two sides:

* ``Broker`` is what producers and admin tools use: publish a batch, read stats, manage dead
  letters. It is safe to share between threads.
* ``Consumer`` is one worker's session with the broker, made by ``Broker.consumer``. It fetches
  batches that the worker then *holds* (they are "in flight" and no other worker gets them while
  this consumer keeps heart-beating), and settles each held delivery exactly one way: ``ack``,
  ``retry``, ``dead_letter`` or ``release``.

Delivery semantics (DESIGN.md): at-least-once. A message leaves the broker only when its outcome
is recorded. Deliveries of a consumer whose heartbeat lapsed for ``heartbeat_timeout`` seconds go
back to their queues (``recover``), whatever their age: a slow task on a live worker is never
handed out twice.

Every broker passes ``tests/brokers/``; a new one joins by adding a fixture there.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Sequence
from typing import Any

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


class QueueStats(msgspec.Struct, frozen=True):
    """How many messages of one queue are in each state."""

    ready: int = 0
    delayed: int = 0
    in_flight: int = 0
    dead: int = 0


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


class Consumer(abc.ABC):
    """One worker's session: fetch, hold, settle. Not shared between workers."""

    #: The id other workers see in the broker; its heartbeat keeps this consumer's deliveries.
    worker_id: str
    queues: tuple[str, ...]
    #: True when ``ack_and_fetch`` does both in one step of the store, cheaper than two.
    combines_ack_and_fetch = False

    @abc.abstractmethod
    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        """Take up to ``max_count`` ready messages, highest priority first, then oldest first.

        Blocks up to ``timeout`` seconds while nothing is ready, without a busy loop, and returns
        an empty list then. Delayed messages whose time has come count as ready.
        """

    def ack_and_fetch(
        self, deliveries: Sequence[Delivery], max_count: int, timeout: float
    ) -> list[Delivery]:
        """``ack(deliveries)``, then ``fetch(max_count, timeout)``: the acknowledgement is
        recorded whatever the fetch finds, and an error means neither happened or only the ack.
        """
        if deliveries:
            self.ack(deliveries)
        return self.fetch(max_count, timeout)

    def prefetch(self, max_count: int) -> None:
        """Start taking up to ``max_count`` more in the background, without waiting.

        The next ``fetch`` returns what this took (or fetches as usual when it took nothing).
        A worker that runs a batch on its own thread calls it first, so that the broker's round
        trip overlaps the work. Brokers that cannot overlap ignore it; what it takes is held
        like anything fetched, and ``close`` releases it.
        """
        return None

    def take_prefetched(self) -> list[Delivery]:
        """What the last ``prefetch`` took, now, without fetching anything else (``[]`` when
        nothing was prefetched); the deliveries are held as usual.

        A worker whose task runs long calls it to hand the prefetched batch back to the broker
        for other workers.
        """
        return []

    @abc.abstractmethod
    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Record these deliveries as done: they leave the broker for good."""

    @abc.abstractmethod
    def retry(self, delivery: Delivery, message: Message) -> None:
        """Replace a held delivery by ``message`` (the next attempt), due at ``message.eta``."""

    @abc.abstractmethod
    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a held delivery to its queue's dead letters, with ``reason`` and its raw bytes."""

    @abc.abstractmethod
    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give held deliveries back, unchanged and ready, to be fetched again (graceful stop)."""

    @abc.abstractmethod
    def heartbeat(self) -> None:
        """Tell the broker this worker is alive, and recover what dead workers held."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release whatever is still held and leave the broker; the consumer is unusable after."""


class Broker(abc.ABC):
    """A message store implementing the contract above."""

    #: The URL this broker was made from, without any password.
    url: str
    #: Seconds after which a silent consumer's deliveries are handed to others.
    heartbeat_timeout: float

    @abc.abstractmethod
    def publish(self, messages: Sequence[Message]) -> None:
        """Store a batch of messages, each in its own queue; return when the broker has them all.

        Encoding happens before anything is written, so an ``EncodeError`` enqueues nothing.
        """

    @abc.abstractmethod
    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        """Store bytes as ready messages of ``queue`` as they are (dead-letter retries, tools)."""

    @abc.abstractmethod
    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> Consumer:
        """Start a worker session on ``queues`` (in the order given)."""

    @abc.abstractmethod
    def queues(self) -> list[str]:
        """Every queue this broker has seen, sorted."""

    @abc.abstractmethod
    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        """Counts per queue, for ``queues`` or for every known queue."""

    @abc.abstractmethod
    def recover(self) -> int:
        """Hand back what dead consumers held; returns how many deliveries went back."""

    @abc.abstractmethod
    def dead_letters(self, queue: str, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        """Dead letters of ``queue``, oldest first."""

    @abc.abstractmethod
    def delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        """Remove these dead letters; returns how many existed."""

    @abc.abstractmethod
    def purge_dead(self, queue: str) -> int:
        """Remove every dead letter of ``queue``; returns how many there were."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of connections and files."""

    def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Put dead letters back in their queue, with a fresh retry budget; returns how many.

        A message that decodes goes back as attempt 0; bytes that never were a message go back
        as they are (and will be dead-lettered again unless something changed).
        """
        wanted = set(ids) if ids is not None else None
        moved = 0
        offset = 0  # dead letters skipped because they were not asked for
        while True:
            page = self.dead_letters(queue, limit=500, offset=offset)
            if not page:
                return moved
            chosen = [d for d in page if wanted is None or d.id in wanted]
            offset += len(page) - len(chosen)
            fresh: list[Message] = []
            raw: list[bytes] = []
            for dead in chosen:
                message = dead.message()
                if message is None:
                    raw.append(dead.raw)
                else:
                    fresh.append(msgspec.structs.replace(message, attempt=0, eta=0.0))
            if fresh:
                self.publish(fresh)
            if raw:
                self.publish_raw(queue, raw)
            if chosen:
                moved += self.delete_dead(queue, [d.id for d in chosen])
            if wanted is not None:
                wanted.difference_update(d.id for d in chosen)
                if not wanted:
                    return moved

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def now() -> float:
    """Wall-clock time as brokers store it (Unix seconds)."""
    return time.time()
