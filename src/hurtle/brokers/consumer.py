"""The consumer side of the broker contract: ``Consumer``, one worker's session that fetches
deliveries, holds them and settles each one way; ``BatchConsumer``, one whose store settles a
batch in one step; ``WrappingConsumer``, one that hands its work to another consumer of the
same worker and changes part of it (a sharded queue's, a fair queue's); ``beat_through``, its
heartbeat on a broker object of its own; and ``fetch_wait``, how long a fetch that found
nothing waits.

The rules a consumer keeps (delivery semantics, late outcomes, limits, control) are set out
with the broker's side, in ``base.py``'s docstring.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeAlias

from ..message import Message
from .records import Delivery, FlowStep, Lock, Ride, StoredResult
from .reports import Reporter, WorkerReport

if TYPE_CHECKING:
    from .base import Broker


class Consumer(abc.ABC):
    """One worker's session: fetch, hold, settle. Not shared between workers."""

    #: The id other workers see in the broker; its heartbeat keeps this consumer's deliveries.
    worker_id: str
    #: This consumer's own timeout (its broker's when it was made): each beat pushes its
    #: deadline to now plus this.
    heartbeat_timeout: float
    queues: tuple[str, ...]
    #: True when ``ack_and_fetch`` does both in one step of the store, cheaper than two.
    combines_ack_and_fetch = False
    #: Set by the worker: each heartbeat stores a report from it in the same step as the beat
    #: (``reports.py``), and confirms it once stored.
    reporter: Reporter | None = None
    #: Set by each fetch that returns deliveries, read in the same step of the store: True when
    #: the broker held cancelled message ids still live (``Broker.cancel``), so the worker must
    #: screen the batch (``Broker.cancelled``). Brokers without cancellation leave it False.
    cancellations: bool = False
    #: The queues of which, by its last fetch, no debounced call had been replaced by a later
    #: call of its key (``Broker.put_latest`` met no record of another call): the debounce
    #: check of what this consumer fetched from them reads no records. A broker that does not
    #: tell (and a consumer that wraps another) leaves it empty: the check reads them.
    unreplaced: frozenset[str] = frozenset()

    @abc.abstractmethod
    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        """Take up to ``max_count`` ready messages, highest priority first, then oldest first.

        Blocks up to ``timeout`` seconds while nothing is ready, without a busy loop, and returns
        an empty list then. Delayed messages whose time has come count as ready.

        A queue lets the messages recovered from dead workers out of quarantine one at a time;
        a fetch over several queues (a sharded queue's shards) reads no further queue once it
        took one of those, so that it holds one at most: a message that kills its worker is
        blamed alone.
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
        trip overlaps the work. Brokers that cannot overlap ignore it, and so may one that
        expects it to come back empty (Redis, after an idle wait that woke to fewer than were
        asked for); what it takes is held like anything fetched, and ``close`` releases it.
        """
        return None

    def prefetch_with_acks(self, max_count: int, ride: Ride) -> bool:
        """``prefetch``, with the outcomes of ``ride`` (acknowledgements, records riding with
        them, unique locks released) sent before it in the same round trip; False when
        nothing was sent (the caller settles ``ride`` itself).

        When it returns True the ride is this consumer's to settle: if the reply says it was
        not recorded (the connection failed, the server forgot a script), it goes to
        ``unsettled_acks``, which the worker sets to its acker's ``give_back_ride`` (an
        acknowledgement recorded twice counts once; a record is stored only while its
        delivery is held). Brokers whose ``acks_ride_prefetch`` is False return False."""
        return False

    #: True when ``prefetch_with_acks`` can carry outcomes.
    acks_ride_prefetch = False
    #: Where a ride sent with a prefetch and not recorded is handed back.
    unsettled_acks: Callable[[Ride], None] | None = None

    def take_prefetched(self) -> list[Delivery]:
        """What the last ``prefetch`` took, now, without fetching anything else (``[]`` when
        nothing was prefetched); the deliveries are held as usual.

        A worker whose task runs long calls it to hand the prefetched batch back to the broker
        for other workers.
        """
        return []

    @abc.abstractmethod
    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        """Record these deliveries as done: they leave the broker for good.

        ``results`` are stored in the same step, before the acknowledgements take effect, each
        for its ``ttl``: a message never counts as done while its record is missing. Waiters of
        ``Broker.watch_results`` are woken. ``results[i]`` rides with ``deliveries[i]`` (the
        record of its message): it is stored only if that delivery is still held by this
        consumer (see "Late outcomes" in ``base.py``), so that the late outcome of a consumer
        taken for dead never replaces the record of the copy delivered again. Results past
        ``len(deliveries)`` ride with none (records of attempts settled otherwise: a failed
        attempt's, a dead letter's) and are stored as they are.
        """

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        """Settle workflow members (chains, chords): each ``FlowStep`` in one atomic step of
        the store with its acknowledgement (see ``FlowStep``, ``ChordStep``)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support workflows (chains and chords): its "
            "ack_flow is missing"
        )

    @abc.abstractmethod
    def retry(self, delivery: Delivery, message: Message) -> None:
        """Replace a held delivery by ``message`` (the next attempt), due at ``message.eta``."""

    def defer(self, delivery: Delivery, eta: float) -> None:
        """Put a held delivery back unchanged (same attempt), due at ``eta`` (Unix seconds).

        Settles it like ``retry``: a delivery no longer held is left alone.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support deferral")

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        """``defer`` each ``(delivery, eta)``; brokers that can do it in one step override this."""
        for delivery, eta in items:
            self.defer(delivery, eta)

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        """For each ``(key, limit, wanted)``: take up to ``wanted`` slots of ``key`` for this
        consumer, so that at most ``limit`` are held across all consumers; returns how many
        each got. Slots held by consumers whose heartbeat deadline passed count as free."""
        raise NotImplementedError(f"{type(self).__name__} does not support concurrency limits")

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        """Give back ``count`` slots of each ``(key, count)`` held by this consumer."""
        raise NotImplementedError(f"{type(self).__name__} does not support concurrency limits")

    def ack_and_release(
        self,
        deliveries: Sequence[Delivery],
        results: Sequence[StoredResult],
        locks: Sequence[Lock],
    ) -> None:
        """``ack`` then ``release_unique``: the acker's flush when settled messages hold
        unique locks. A broker that can send both in one round trip does (Redis); if this
        raises, the locks may still be held and the caller releases them again."""
        self.ack(deliveries, results)
        if locks:
            self.release_unique(locks)

    def release_unique(self, locks: Sequence[Lock]) -> None:
        """End the unique locks ``(queue, key, message id, until)`` still held for that
        message. ``until`` is the message's ``headers["unique_until"]`` (0 when it has none):
        a broker whose lock ends then may end, without reading it, a lock that cannot have
        passed to another message yet."""
        raise NotImplementedError(f"{type(self).__name__} does not support unique locks")

    @abc.abstractmethod
    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a held delivery to its queue's dead letters, with ``reason`` and its raw bytes.

        In the same step, drop that queue's dead letters older than the broker's
        ``dead_letter_ttl``, then the oldest beyond its ``dead_letter_max`` (``log_trimmed``).
        """

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        """``dead_letter`` each ``(delivery, reason)``; brokers that can do it in one step of
        the store override this (the worker gathers the dead letters of messages it does not
        run, expired or cancelled, into one call)."""
        for delivery, reason in items:
            self.dead_letter(delivery, reason)

    @abc.abstractmethod
    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give held deliveries back, unchanged and ready, to be fetched again (graceful stop)."""

    @abc.abstractmethod
    def heartbeat(self) -> bool:
        """Tell the broker this worker is alive, and recover what dead workers held.

        Returns True while recovery has more to do soon (recovered messages wait to be let out
        one at a time): the caller then beats again sooner than usual.
        """

    def send_report(self) -> None:
        """Store a report from ``reporter`` as a beat does (the report, and its delta added to
        the totals; then ``confirm``), without beating: what a busy worker sends between its
        beats, at most once a second, so that the figures move while it works
        (``worker/heartbeat.py``). This default beats; brokers override it with the report's
        part of their beat."""
        self.heartbeat()

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        """``(beat, end)``: ``beat`` does what ``heartbeat`` does for this consumer, through
        connections of its own; ``end`` lets go of them (and releases nothing).

        Made and used on one other OS thread: the worker's heartbeat thread under gevent or
        eventlet, where this consumer's connections belong to the main thread's event loop.
        Brokers whose store lives in this process beat through the consumer itself.
        """
        return self.heartbeat, _nothing

    @contextlib.contextmanager
    def _reporting(self) -> Iterator[WorkerReport | None]:
        """A report from ``reporter`` (None without one) for the step of the store this wraps
        (a beat, a report, a close), confirmed once that step is done; not when it raises, so
        that the next report carries its counts again."""
        reporter = self.reporter
        if reporter is None:
            yield None
            return
        report = reporter.report()
        yield report
        reporter.confirm(report)

    @abc.abstractmethod
    def close(self) -> None:
        """Release whatever is still held and leave the broker; the consumer is unusable after.

        With a ``reporter``, the worker leaves with a last report in the same step: what it
        counted since its last beat goes to the totals, and its report is removed, so that
        ``workers()`` no longer lists it and ``totals()`` counts everything it ran (a worker
        that ran for less than a heartbeat interval included).
        """


class BatchConsumer(Consumer):
    """A consumer whose store settles a batch in one step: its ``dead_letter`` and ``defer``
    are its ``dead_letter_many`` and ``defer_many`` of one item."""

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.dead_letter_many([(delivery, reason)])

    @abc.abstractmethod
    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        """``Consumer.dead_letter_many``, every item in one step of the store."""

    def defer(self, delivery: Delivery, eta: float) -> None:
        self.defer_many([(delivery, eta)])

    @abc.abstractmethod
    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        """``Consumer.defer_many``, every item in one step of the store."""


#: ``last`` of ``WrappingConsumer._settle``: settles one consumer's part of an acknowledgement.
Settle: TypeAlias = Callable[[Consumer, Sequence[Delivery], Sequence[StoredResult]], None]


class WrappingConsumer(Consumer):
    """``inner``, a consumer of the same worker, for ``queues``: what a subclass does not
    change goes to ``inner`` as it is (its reporter, limits, heartbeat, report and close).

    Settling goes through two hooks: ``_settle`` splits an acknowledgement between ``inner``
    and any other consumer that holds some of its deliveries, and ``_locks`` gives the unique
    locks as ``inner`` holds them; each is ``inner``'s own by default.
    """

    def __init__(self, inner: Consumer, queues: tuple[str, ...]) -> None:
        self.inner = inner
        self.queues = queues
        self.worker_id = inner.worker_id
        self.heartbeat_timeout = inner.heartbeat_timeout

    @property
    def reporter(self) -> Reporter | None:
        return self.inner.reporter

    @reporter.setter
    def reporter(self, value: Reporter | None) -> None:
        self.inner.reporter = value

    # -- settling -------------------------------------------------------------------------

    def _settle(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult], last: Settle
    ) -> None:
        """Settle ``deliveries`` with ``results`` as ``Consumer.ack`` does (``results[i]``
        with ``deliveries[i]``, those past them with none): ``last(inner, d, r)`` settles
        ``inner``'s part, and is always called (with nothing when ``inner`` holds none).
        By default all is ``inner``'s, as given."""
        last(self.inner, deliveries, results)

    def _locks(self, locks: Sequence[Lock]) -> Sequence[Lock]:
        """``locks`` as ``inner`` holds them; by default as given."""
        return locks

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        self._settle(deliveries, results, _ack)

    def ack_and_release(
        self,
        deliveries: Sequence[Delivery],
        results: Sequence[StoredResult],
        locks: Sequence[Lock],
    ) -> None:
        held = self._locks(locks)

        def last(inner: Consumer, d: Sequence[Delivery], r: Sequence[StoredResult]) -> None:
            if d or r:
                inner.ack_and_release(d, r, held)
            elif held:
                inner.release_unique(held)

        self._settle(deliveries, results, last)

    def release_unique(self, locks: Sequence[Lock]) -> None:
        self.inner.release_unique(self._locks(locks))

    # -- limits: the worker's, kept by ``inner`` ------------------------------------------

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        return self.inner.acquire_slots(requests)

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        self.inner.release_slots(releases)

    # -- the session ----------------------------------------------------------------------

    def heartbeat(self) -> bool:
        return self.inner.heartbeat()

    def send_report(self) -> None:
        self.inner.send_report()

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        return self.inner.heartbeat_session()

    def close(self) -> None:
        self.inner.close()


def _ack(inner: Consumer, deliveries: Sequence[Delivery], results: Sequence[StoredResult]) -> None:
    if deliveries or results:
        inner.ack(deliveries, results)


def fetch_wait(deadline: float, longest: float, due_in: float | None) -> float | None:
    """How long a fetch that found nothing waits before it looks again: at most ``longest``,
    not past its ``deadline`` (``time.monotonic``), nor past ``due_in`` seconds from now when
    a delayed message falls due then; None once the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    wait = min(left, longest)
    if due_in is not None:
        wait = min(wait, due_in)
    return wait


def _nothing() -> None:
    return None


def beat_through(own: Broker, consumer: Consumer) -> tuple[Callable[[], bool], Callable[[], None]]:
    """``consumer.heartbeat_session()`` through ``own``, a broker object of its own on the same
    store: a consumer of the same id and reporter beats there; ending it closes ``own``."""
    try:
        beater = own.consumer(consumer.queues, consumer.worker_id)
        beater.reporter = consumer.reporter
    except BaseException:
        own.close()
        raise
    return beater.heartbeat, own.close
