"""The broker contract: what every broker implements, batch-first.

Two sides:

* ``Broker`` is what producers and admin tools use: publish a batch, read stats, manage dead
  letters. It is safe to share between threads.
* ``Consumer`` (``consumer.py``) is one worker's session with the broker, made by
  ``Broker.consumer``. It fetches batches that the worker then *holds* (they are "in flight"
  and no other worker gets them while this consumer keeps heart-beating), and settles each held
  delivery exactly one way: ``ack``, ``retry``, ``dead_letter`` or ``release``.

Delivery semantics (DESIGN.md): at-least-once. A message leaves the broker only when its outcome
is recorded. Each consumer beats with a deadline of its own (the time of the beat plus the
``heartbeat_timeout`` of the broker it was made from); the deliveries of a consumer whose deadline
passed go back to their queues (``recover``), whatever their age: a slow task on a live worker is
never handed out twice, whatever timeout the worker that recovers has.

Dead letters are found by message id through an index of each broker's (``find_dead``), kept
with the dead letters: a lookup costs one read whatever the number of queues. A queue's dead
letters include those of its fair keys' sub-queues, each named as the queue's
(``fair_admin.py``).

Dead letters are bounded per queue (``dead_letter_max``, ``dead_letter_ttl``): each dead-letter
write also drops, in the same step of the store, the queue's dead letters older than the ttl and
then the oldest beyond the cap. Drops by the cap are logged as warnings, expiries as info.

Size limits: a broker stores messages of at most ``Broker.max_message_size`` bytes, encoded,
and result records of at most ``Broker.max_result_size``. ``publish``, ``publish_unique`` and
``claim_tick`` check the first where they encode (``message.encode_many``): a larger message is
an ``EncodeError`` at the call, naming the task, its size and the limit, and nothing of the
batch is stored. A result record over the second fails its call with a ``ResultError``
(``middleware.results``). Both are hurtle's own cap (``MAX_SIZE``, 64 MiB, below what SQLite
and Redis take: 1 GB, 512 MB) on the memory, SQLite and Redis brokers, and the server's
``max_payload`` (1 MB unless the server is set otherwise) less 8 KiB for headers and a dead
letter's reason on NATS. A broker may be given lower limits (set the attributes), never higher
ones than its store takes (``tests/brokers/test_contract.py``).

Results: ``Consumer.ack(deliveries, results)`` stores task results (``StoredResult``: an id,
opaque bytes, a ttl) in the same step as the acknowledgements; ``Broker.get_result`` reads one;
``Broker.watch_results`` wakes waiters where the store can notify (``tests/brokers/
test_results_contract.py``).

Late outcomes: a consumer whose deadline passed while it lived (paused, or cut off from the
store) comes back to find that what it held went to other workers. Whatever it settles then is
ignored — the copy delivered again is the one that counts — and that covers what rides with the
settlement, not only the acknowledgement itself: a record that rides with a delivery
(``results[i]`` with ``deliveries[i]``) and a workflow step's effects (``ack_flow``) take
effect only for deliveries this consumer still holds, decided in the same atomic step of the
store as the acknowledgement's own check (one transaction, one script, one section under a
lock). Where the
store cannot do both in one step (a Redis Cluster, whose result keys live in other slots than
the queue's; NATS, whose records are in KV buckets), the check comes first, in its own step,
and only then are the records of the deliveries still held written, before the
acknowledgement: a record is never missing for a message that counts as done, and what remains
is the window between the check and the write (``docs/brokers.md``, "Delivery semantics").
A new broker follows the same rule (``tests/brokers/test_late_contract.py``).
Workflows: ``Consumer.ack_flow`` acknowledges a chain link or chord member together with what
it sets off (the next link's message; the chord's counter, and its callback when the counter
completes) in one atomic step; ``Broker.chord_results`` reads a chord's member results once, for
its callback (``tests/brokers/test_workflows_contract.py``).
Limits and unique locks live in the broker too, so that every worker sharing it sees them:

* rate limits: ``Broker.take_tokens`` takes tokens of several keys in one call (GCRA in the
  store's clock: ``limit`` tokens per ``period``, evenly spread, a burst of at most a tenth of
  ``limit`` (at least 2) to make up for workers that come late);
* concurrency limits: ``Consumer.acquire_slots`` / ``release_slots``; a slot is held by the
  consumer that took it, and the slots of a consumer whose heartbeat deadline passed are free;
* unique locks: ``Broker.publish_unique`` takes a lock per message (its key in
  ``headers["unique"]``, held for ``unique_for`` seconds, storing the message id) in the same
  step as the publish, and enqueues only the messages that got theirs;
  ``Consumer.release_unique`` ends locks whose message is settled (a lock taken again by
  another message since is left alone);
* ``Consumer.defer`` puts a held delivery back unchanged (same attempt), due later: a throttled
  message is not a failure.

Control (``tests/brokers/test_control_contract.py``):

* cancel: ``Broker.cancel`` records message ids in a cancel set, each for a ttl. A fetch tells
  its consumer, in the same step of the store, whether the set holds any id still live
  (``Consumer.cancellations``); only then does the worker ask ``Broker.cancelled`` which ids of
  the batch are cancelled — one call per batch, none while nothing is cancelled. Deliveries
  that wait in a worker longer than ``worker.screen.WINDOW`` before they start are asked
  about again, all in one call (``worker.screen``);
* pause: ``Broker.pause`` / ``resume`` set a flag per queue that every fetch reads in its own
  step: a paused queue is not fetched by any worker until resumed (what is in flight finishes).
* purge: ``Broker.purge`` drops a queue's waiting messages (ready and delayed), its fair keys'
  sub-queues' too (``fair_admin.py``), never those in flight
  (``tests/brokers/test_purge_contract.py``).

Progress (``tests/brokers/test_progress_contract.py``): ``Broker.put_progress`` stores the
latest progress report of running messages (opaque bytes, ``hurtle.progress``), each under its
message id for its ttl, in one call for a worker's whole interval of reports;
``Broker.get_progress`` reads several in one call. They live apart from result records: a
report never replaces a result, nor a result a report.

Debounce (``tests/brokers/test_debounce_contract.py``, ``hurtle.debounce``): ``put_latest``
records the latest call of debounce keys for a ttl, once per published batch; ``get_latest``
reads them, ``get_other_latest`` those not of the calls they are read for (once per queue of a
fetched batch). All over the progress store, as are ``put_rate_cuts`` / ``get_rate_cuts``.

Every broker passes ``tests/brokers/``; a new one joins by adding a fixture there.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypedDict

import msgspec

from ..adaptive import cut_name
from ..debounce import latest_name, other_records
from ..errors import ConfigurationError
from ..message import Message, check_messages, encode_many
from ..settings import DEFAULT_DEAD_LETTER_MAX, DEFAULT_DEAD_LETTER_TTL, not_transactional
from .common import check_dead_letter_limits, unique_key_of
from .consumer import Consumer as Consumer  # the contract's other side, named here too
from .fair_admin import FairAdmin
from .records import QueueStats, StoredResult
from .reports import TaskCounts, WorkerReport
from .ticks import TickBatch, TickClaim, check_tick_claim

log = logging.getLogger(__name__)


#: How many of the keys ``publish_once`` stored lately a queue remembers, at least (Redis: two
#: generations of this many; a key per outbox row, or per message sent on its own): far more
#: than the one batch a relay that died can have left.
ONCE_KEEP = 50_000

#: The size limit hurtle keeps to where the store's own is larger (64 MiB): a runaway value fails
#: at its call rather than filling the store, or a worker's memory when it is fetched in a batch.
MAX_SIZE = 64 * 1024 * 1024


class BrokerOptions(TypedDict, total=False):
    """The options every broker takes by keyword: each broker's constructor (and
    ``make_broker``) passes them on to ``Broker.__init__``, which has their defaults."""

    heartbeat_timeout: float
    dead_letter_max: int
    dead_letter_ttl: float
    max_recoveries: int


class Broker(FairAdmin, abc.ABC):
    """A message store implementing the contract above (its purge and dead letters: in
    ``FairAdmin``, over the ``_stored_*`` methods a broker implements)."""

    #: The URL this broker was made from, without any password.
    url: str
    #: Seconds after which a silent consumer's deliveries are handed to others.
    heartbeat_timeout: float
    #: Most dead letters kept per queue, ``0`` for no limit (``check_dead_letter_limits``).
    dead_letter_max: int
    #: Seconds a dead letter is kept, ``0`` for no limit.
    dead_letter_ttl: float
    #: Deaths of its worker a message survives before it becomes a dead letter.
    max_recoveries: int
    #: Whether a batch's succeeded records are stored whole (``StoredResults.batches``, the
    #: body of each ``ResultBatch``) rather than one by one (its payloads).
    result_batches: bool = False
    #: Most bytes of one encoded message (see "Size limits" above): larger is an EncodeError.
    max_message_size: int = MAX_SIZE
    #: Most bytes of one result record: a larger one fails its call with a ResultError.
    max_result_size: int = MAX_SIZE

    def __init__(
        self,
        *,
        heartbeat_timeout: float = 20.0,
        dead_letter_max: int = DEFAULT_DEAD_LETTER_MAX,
        dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL,
        max_recoveries: int = 3,
    ) -> None:
        """Take the options every broker shares (``BrokerOptions``), the dead-letter limits
        checked before a broker opens anything; a broker's own constructor calls this first."""
        self.dead_letter_max, self.dead_letter_ttl = check_dead_letter_limits(
            dead_letter_max, dead_letter_ttl
        )
        self.heartbeat_timeout = heartbeat_timeout
        self.max_recoveries = max_recoveries

    @abc.abstractmethod
    def publish(self, messages: Sequence[Message]) -> None:
        """Store a batch of messages, each in its own queue; return when the broker has them all.

        Encoding happens before anything is written, so an ``EncodeError`` enqueues nothing.
        """

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        """Publish the messages that can take their unique lock, in the same step.

        Each message names its lock in ``headers["unique"]`` (a str; locks are per queue). A
        lock held (by a message published earlier, or earlier in this batch) keeps its message
        out; a lock taken is held ``unique_for`` seconds, or until ``release_unique``. Returns,
        per message, the id of the message that holds its lock: its own when it was enqueued.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support unique locks")

    def publish_in(
        self, connection: object, messages: Sequence[Message], unique_for: float | None = None
    ) -> list[str]:
        """Write the messages with ``connection``, the application's own connection to the
        broker's database, inside its open transaction: they run once it commits, never if it
        rolls back (``send(connection=...)``, docs/transactions.md). With ``unique_for``, as
        ``publish_unique`` (the locks are taken in that transaction too). Returns per message
        the id of the message that holds its lock: its own, without ``unique_for``.

        Only a broker that lives in a database the application writes to can: PostgreSQL.
        Any other raises ``ConfigurationError``.
        """
        raise ConfigurationError(not_transactional(self.url))

    def publish_once(
        self,
        messages: Sequence[Message],
        payloads: Sequence[bytes] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        """``publish``, skipping what an earlier ``publish_once`` stored lately (the outbox's
        relay: a batch published again after the relay died before its commit is not stored
        twice). ``units``: the sizes of the runs of ``messages`` stored or skipped whole (an
        outbox row each: never changed once written), each under the id of its first message
        in each queue; by default every message is a unit of its own. Redis keeps the newest
        ``ONCE_KEEP`` unit keys or more per queue, read and written in the same script as the
        push; NATS stores each message under its id as ``Nats-Msg-Id`` (``units`` unused),
        which JetStream drops as a duplicate within the stream's duplicate window (two
        minutes). ``payloads``: the messages encoded already (the relay has them as they were
        written), checked against ``max_message_size`` rather than encoded again."""
        raise ConfigurationError(
            f"{type(self).__name__} cannot relay an outbox (its publish_once is missing): use "
            "outbox= with a Redis, Redis Cluster or NATS broker"
        )

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        """For each ``(key, limit, period, wanted)``: take up to ``wanted`` of the ``limit``
        tokens per ``period`` seconds of ``key``; returns per request ``(granted, wait)``,
        ``wait`` the seconds until the next token is due when fewer were granted (else 0)."""
        raise NotImplementedError(f"{type(self).__name__} does not support rate limits")

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        """Record these message ids as cancelled for ``ttl`` seconds: a worker that fetches one
        of them before then does not run it (``cancelled``). Cancelling an id that already ran,
        or that no message has, changes nothing but the set."""
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` are cancelled and still live, in one call."""
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    def cancellations_live(self) -> bool:
        """False when no cancellation is live now (one look, nothing per id), so that a worker
        re-screening the deliveries it holds (``worker/screen.py``) need not ask ``cancelled``
        about each; True when some may be, or when the broker cannot tell cheaply. A
        cancellation counts from the moment ``cancel`` stores it, as for ``cancelled``."""
        return True

    def uncancel(self, ids: Sequence[str]) -> None:
        """Forget the cancellations of these ids (a cancelled dead letter that is retried)."""
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        """Store progress reports (``hurtle.progress``, opaque here), each under its message
        id for its ttl, in one step: a later report of an id replaces the earlier one."""
        raise NotImplementedError(f"{type(self).__name__} does not store progress reports")

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        """The progress report last stored for each of ``ids`` (None where there is none or
        it expired), in one call."""
        raise NotImplementedError(f"{type(self).__name__} does not store progress reports")

    def put_latest(self, latest: Sequence[tuple[str, str, str]], ttl: float) -> None:
        """Record, for each ``(queue, key, value)``, ``value`` (the latest call of the debounce
        ``key`` sent to ``queue``: ``debounce.latest_value``, opaque here) for ``ttl`` seconds,
        in one step: a later record of a key replaces the earlier one (the last writer wins),
        as does a later one in ``latest`` itself, which may name a key more than once.

        Kept in the progress store under ``debounce.latest_name`` (which message ids never
        collide with): a broker whose progress store works has this too."""
        last = {(q, key): value for q, key, value in latest}
        self.put_progress(
            [StoredResult(latest_name(q, key), v.encode(), ttl) for (q, key), v in last.items()]
        )

    def get_latest(self, queue: str, keys: Sequence[str]) -> list[str | None]:
        """The value last recorded for each debounce key of ``queue`` (None where there is
        none or it expired), in one call."""
        found = self.get_progress([latest_name(queue, key) for key in keys])
        return [None if f is None else bytes(f).decode() for f in found]

    def get_other_latest(
        self, queue: str, keys: Sequence[str], ids: Sequence[str]
    ) -> dict[int, str]:
        """By index ``i``, the record of ``keys[i]`` of ``queue`` where it is not the call
        ``ids[i]``'s own (``debounce.other_records``), in one call."""
        return other_records(self.get_latest(queue, keys), ids)

    def put_rate_cuts(self, cuts: Sequence[tuple[str, bytes, float]]) -> None:
        """Record, for each ``(key, record, ttl)``, the cut of the rate limit ``key``
        (``adaptive.Cut``, opaque here) for ``ttl`` seconds, in one step; over the progress
        store, under ``adaptive.cut_name``, as ``put_latest``."""
        self.put_progress([StoredResult(cut_name(k), r, ttl) for k, r, ttl in cuts])

    def get_rate_cuts(self, keys: Sequence[str]) -> list[bytes | None]:
        """The cut last recorded for each rate limit key (None where none), in one call."""
        return self.get_progress([cut_name(key) for key in keys])

    def pause(self, queue: str) -> None:
        """Stop every worker from fetching ``queue`` until ``resume``; what it holds finishes."""
        raise NotImplementedError(f"{type(self).__name__} does not support pausing queues")

    def resume(self, queue: str) -> None:
        """Let workers fetch ``queue`` again (nothing happens if it was not paused)."""
        raise NotImplementedError(f"{type(self).__name__} does not support pausing queues")

    def paused(self) -> set[str]:
        """The queues paused now."""
        raise NotImplementedError(f"{type(self).__name__} does not support pausing queues")

    def forget(self, queue: str) -> bool:
        """Drop ``queue`` from the known queues (``queues()``) if it is empty: nothing ready,
        delayed, in flight or dead, and not paused. Returns whether it is not known now (True
        also for a name never seen); False, changing nothing, when it holds messages or is
        paused. The next message published to it makes it known again (on SQLite, a broker
        object that wrote the queue's name less than ``KNOWN_REFRESH`` seconds before, a
        minute, writes it with its first message after that: meanwhile what it publishes is
        fetched and counted but the queue is not listed).

        Only the name goes: a store may keep bookkeeping of its own (cursors, streams) that
        costs nothing while the queue is empty.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot forget queues: its forget is missing"
        )

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
    def close(self) -> None:
        """Let go of connections and files."""

    def claim_tick(
        self,
        queue: str,
        name: str,
        tick: float,
        messages: Sequence[Message],
        unique_for: float | None = None,
    ) -> TickClaim:
        """Claim ``tick`` of the schedule ``name`` and publish ``messages`` (all of ``queue``):
        in one atomic step, if ``tick`` was not claimed yet (``ticks.claimable``: the broker
        keeps the schedule's latest claimed ticks), record it and store the messages; else
        change nothing.
        A tick more than ``ticks.TICK_SKEW`` ahead of the broker's clock is refused as early.
        With ``unique_for`` (a task's), each message takes its unique lock in the same step, as
        ``publish_unique`` does, and one whose lock is held is not stored (the tick is still
        recorded: a unique call skipped is not retried).

        The record is kept per ``(queue, name)``, beside the queue (one hash tag in Redis).
        """
        check_tick_claim(queue, tick, messages, unique_for)
        check_messages(messages)
        keys = [unique_key_of(m) for m in messages] if unique_for is not None else None
        payloads = encode_many(list(messages), self.max_message_size)
        return self._store_tick(TickBatch(queue, name, tick, messages, payloads, keys, unique_for))

    @abc.abstractmethod
    def _store_tick(self, batch: TickBatch) -> TickClaim:
        """``claim_tick``'s one atomic step in the store, once ``batch`` is checked and encoded."""

    @abc.abstractmethod
    def last_tick(self, queue: str, name: str) -> float | None:
        """The last tick claimed for the schedule ``name`` of ``queue``, or ``None``."""

    @abc.abstractmethod
    def workers(self) -> list[WorkerReport]:
        """The last report of every worker whose deadline has not passed, by id, each with
        its ``deadline``; reports of workers past theirs are forgotten."""

    @abc.abstractmethod
    def totals(self) -> list[TaskCounts]:
        """The cluster's counters per (queue, task), sorted: every increase workers reported,
        dead workers' included (``reports.py``)."""

    @abc.abstractmethod
    def get_result(self, id: str) -> bytes | None:
        """The payload last stored under message ``id`` (``Consumer.ack``), or None when there
        is none or it expired."""

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        """The ``limit`` delayed messages of ``queue`` due first, as ``(eta, raw bytes)``, soonest
        first; None when this broker cannot list them cheaply (the dashboard then shows counts
        only)."""
        return None

    def watch_results(
        self, ids: Sequence[str], wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Call ``wake`` (from any thread, without arguments) whenever a result may have been
        stored for one of ``ids``; returns a function that stops watching.

        Returns None when this broker cannot notify: the waiter then re-reads with short sleeps.
        A wake may be spurious; a waiter reads the record after it starts watching, so that a
        result stored just before is not missed.
        """
        return None

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        """The payloads of the ``total`` members of chord ``id`` (``ChordStep``), in member
        order, read in one step; None when the chord's record is missing, expired or short."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support workflows (chains and chords): its "
            "chord_results is missing"
        )

    def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Put dead letters back in their queue, with a fresh retry budget; returns how many.
        A fair key's message goes back to its key's sub-queue (the queue its bytes name).

        A message that decodes goes back as attempt 0, due now and without its expiry time (a
        message that expired is run when retried; a cancelled one loses its cancellation);
        bytes that never were a message go back as they are (and will be dead-lettered again
        unless something changed).
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
            uncancel = [
                m.id for d in chosen if d.reason == "cancelled" and (m := d.message()) is not None
            ]
            if uncancel:  # asked to run after all: its cancellation must not stop it again
                self.uncancel(uncancel)
            for dead in chosen:
                message = dead.message()
                if message is None:
                    raw.append(dead.raw)
                else:
                    fresh.append(msgspec.structs.replace(message, attempt=0, eta=0.0, expires=0))
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
