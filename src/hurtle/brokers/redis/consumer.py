"""``RedisConsumer``: one worker's session — fetch, prefetch, ack, retry, dead letter, defer."""

from __future__ import annotations

import contextlib
import math
import struct
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

import redis

from ...errors import BrokerError, EncodeError
from ...ids import new_id
from ...message import MAX_PRIORITY, Message
from ..base import Consumer, Delivery, FlowStep, Lock, StoredResult
from ..common import log_trimmed
from ..keys import BATCH_BITS, BATCH_MASK, QUEUES, QueueKeys, queue_keys
from . import flows
from .limits import _Limits
from .results import _results_commands
from .scripts import _PRIORITY_ARG, _Command, _publish_keys
from .workers import _beat_reporting

if TYPE_CHECKING:
    from .broker import RedisBroker

#: Longest single ``BLPOP``; a longer ``fetch`` timeout blocks in several steps of this.
MAX_BLOCK = 5.0
#: Due delayed messages promoted per fetch, at least (more when the batch is larger).
PROMOTE_LIMIT = 1000


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
    unique = set(receipts)
    ordered = sorted(unique) if len(unique) != len(receipts) else sorted(receipts)
    args: list[Any] = []
    n = len(ordered)
    start = 0
    while start < n:
        batch = ordered[start] >> BATCH_BITS
        end = bisect_left(ordered, (batch + 1) << BATCH_BITS, start)
        indexes = [r & BATCH_MASK for r in ordered[start:end]]
        args += (batch, end - start, struct.pack(f"<{end - start}I", *indexes))
        start = end
    return args


class _Target:
    """One queue of a consumer, with its script keys built once."""

    __slots__ = ("fetch_keys", "fetched", "inflight", "keys", "name", "token")

    def __init__(self, name: str, worker_id: str) -> None:
        self.name = name
        self.keys: QueueKeys = queue_keys(name)
        k = self.keys
        self.inflight = k.inflight(worker_id)
        self.fetched = k.fetched(worker_id)
        self.fetch_keys = (
            *k.ready,
            k.delayed,
            self.inflight,
            k.workers,
            k.wake,
            k.seq,
            self.fetched,
            k.dead,
            k.dead_raw,
            k.dead_reason,
            k.paused,
            k.cancels,
        )
        #: The token of the next fetch from this queue: a new one once a reply has been read.
        self.token = new_id()


class RedisConsumer(_Limits, Consumer):
    """One worker's session: what it holds is under ``hurtle:{queue}:inflight:<worker_id>``."""

    def __init__(self, broker: RedisBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        #: This worker's own timeout: its deadline, as other workers see it, is a beat plus this.
        self.heartbeat_timeout = broker.heartbeat_timeout
        self._timeout_arg = repr(float(broker.heartbeat_timeout))
        self._targets = {name: _Target(name, worker_id) for name in dict.fromkeys(queues)}
        self._reading = list(self._targets.values())
        self._wake_keys = [t.keys.wake for t in self._reading]
        self._fetch = broker._scripts.fetch
        # a fetch script sent by ``prefetch`` whose reply is still to be read:
        # (connection, its pool, want)
        self._pending: tuple[Any, Any, int] | None = None
        #: concurrency key -> slots this consumer holds (their deadlines move with each beat)
        self._slots: dict[str, int] = {}

    def _target(self, queue: str) -> _Target:
        target = self._targets.get(queue)
        if target is None:  # a delivery from a queue this consumer does not read: still settle it
            target = self._targets[queue] = _Target(queue, self.worker_id)
        return target

    def prefetch(self, max_count: int) -> None:
        if self._pending is not None or len(self._reading) != 1 or max_count <= 0:
            return  # several queues are read in turn: nothing to overlap
        max_count = min(max_count, BATCH_MASK)
        pool = self._pool_of(self._reading[0])
        # Whatever fails here, the next fetch meets the problem and reports it; if the command
        # did reach the server, that fetch carries the same token and hands the batch back.
        try:
            conn = pool.get_connection()
        except (redis.RedisError, OSError):
            return
        try:
            conn.send_command(*self._fetch_command(self._reading[0], max_count))
        except (redis.RedisError, OSError):
            pool.release(conn)
            conn.disconnect()
            return
        self._pending = (conn, pool, max_count)

    def _pool_of(self, target: _Target) -> Any:
        """The connection pool of the server that holds ``target``'s keys."""
        return self.broker._client.connection_pool

    def _block(self, seconds: float) -> None:
        """Wait until a publish pushes a token to one of the wake lists, or ``seconds`` pass."""
        self.broker._blocking.execute_command("BLPOP", *self._wake_keys, seconds)

    def take_prefetched(self) -> list[Delivery]:
        if self._pending is None:
            return []
        try:
            return self._collect()
        except redis.RedisError as err:
            self.broker._fail(err, f"fetching from {list(self.queues)}")

    def _fetch_command(self, target: _Target, want: int) -> tuple[Any, ...]:
        return (
            "EVALSHA",
            self._fetch.sha,
            len(target.fetch_keys),
            *target.fetch_keys,
            want,
            self.worker_id,
            max(PROMOTE_LIMIT, want),
            target.token,
            self._timeout_arg,
        )

    def _collect(self) -> list[Delivery]:
        """Read the reply of the fetch ``prefetch`` sent."""
        assert self._pending is not None
        conn, pool, want = self._pending
        self._pending = None
        try:
            res = conn.read_response()
        except NoScriptError:
            pool.release(conn)
            return self._take(want)[0]
        except BaseException:
            conn.disconnect()  # a reply half read: the connection cannot be reused
            pool.release(conn)
            raise
        pool.release(conn)
        target = self._reading[0]
        target.token = new_id()
        self.cancellations = bool(res[1])
        return self._deliveries(target.name, res)

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        if max_count <= 0:
            return []
        if self._pending is not None:
            try:
                out = self._collect()
            except redis.RedisError:
                out = []  # the reply is lost: ``_take`` sends the fetch again, same token
            if out:
                return out
        max_count = min(max_count, BATCH_MASK)
        deadline = time.monotonic() + timeout
        while True:
            out, wait_ms = self._take(max_count)
            if out:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            block = min(left, MAX_BLOCK)
            if wait_ms >= 0:
                block = min(block, wait_ms / 1000)
            # BLPOP takes seconds with millisecond resolution, and 0 would mean forever.
            block = max(math.ceil(block * 1000), 1) / 1000
            try:
                self._block(block)
            except redis.RedisError as err:
                self.broker._fail(err, f"waiting for messages on {list(self.queues)}")

    def _take(self, max_count: int) -> tuple[list[Delivery], int]:
        """Run the fetch script on each queue in order until ``max_count`` are taken."""
        out: list[Delivery] = []
        wait_ms = -1
        cancellations = False
        for target in self._reading:
            try:
                res = self.broker._eval(
                    self._fetch,
                    target.fetch_keys,
                    (
                        max_count - len(out),
                        self.worker_id,
                        max(PROMOTE_LIMIT, max_count),
                        target.token,
                        self._timeout_arg,
                    ),
                    f"fetching from {target.name!r}",
                )
            except BrokerError:
                if out:  # held already: hand them over; this queue is asked again next time
                    self.cancellations = True  # not known for them all: the worker asks
                    return out, 0
                raise
            target.token = new_id()
            if len(res) > 2:
                cancellations = cancellations or bool(res[1])
                out += self._deliveries(target.name, res)
                if len(out) >= max_count:
                    break
            elif res[0] >= 0 and (wait_ms < 0 or res[0] < wait_ms):
                wait_ms = res[0]
        if out:
            self.cancellations = cancellations
        return out, wait_ms

    @staticmethod
    def _deliveries(name: str, res: list[Any]) -> list[Delivery]:
        """Deliveries from a fetch script's reply (after its wait and cancels flag): one batch
        per priority, id then payloads."""
        out: list[Delivery] = []
        for at in range(2, len(res), 2):
            base = res[at] << BATCH_BITS
            raws = res[at + 1]
            n = len(raws)
            out += map(Delivery, repeat(name, n), raws, range(base, base + n))
        return out

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        if not deliveries and not results:
            return
        self.broker._pipeline_raw(
            self._ack_commands(deliveries, results),
            f"acknowledging {len(deliveries)} deliveries",
        )

    def ack_and_release(
        self,
        deliveries: Sequence[Delivery],
        results: Sequence[StoredResult],
        locks: Sequence[Lock],
    ) -> None:
        # one round trip: the records, the acknowledgements, then the locks they held
        commands = self._ack_commands(deliveries, results) + self._unique_commands(locks)
        if commands:
            self.broker._pipeline_raw(
                commands,
                f"acknowledging {len(deliveries)} deliveries and releasing their unique locks",
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
        # the records first: a message never counts as done while one is missing
        commands: list[_Command] = _results_commands(self.broker, results) if results else []
        commands += [
            self.broker._call(script, (self._target(q).inflight,), _ack_args(receipts))
            for q, receipts in groups.items()
        ]
        return commands

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
            self.dead_letter(
                delivery,
                f"cannot store the next attempt: {problem}; this is the message as delivered",
            )
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

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        target = self._target(delivery.queue)
        k = target.keys
        receipt = delivery.receipt
        b = self.broker
        _, expired, dropped = b._eval(
            b._scripts.dead_letter,
            (target.inflight, k.dead, k.dead_raw, k.dead_reason),
            (
                receipt >> BATCH_BITS,
                receipt & BATCH_MASK,
                new_id(),
                reason,
                delivery.raw,
                repr(b.dead_letter_ttl),
                b.dead_letter_max,
            ),
            f"dead-lettering a message of {delivery.queue!r}",
        )
        log_trimmed(b, delivery.queue, expired, dropped)

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        """``dead_letter.lua`` per delivery, pipelined: one round trip for them all."""
        if not items:
            return
        b = self.broker
        commands = []
        for delivery, reason in items:
            target = self._target(delivery.queue)
            k = target.keys
            receipt = delivery.receipt
            commands.append(
                b._call(
                    b._scripts.dead_letter,
                    (target.inflight, k.dead, k.dead_raw, k.dead_reason),
                    (
                        receipt >> BATCH_BITS,
                        receipt & BATCH_MASK,
                        new_id(),
                        reason,
                        delivery.raw,
                        repr(b.dead_letter_ttl),
                        b.dead_letter_max,
                    ),
                )
            )
        results = b._pipeline(commands, f"dead-lettering {len(items)} messages")
        trimmed: dict[str, tuple[int, int]] = {}
        for (delivery, _), (_, expired, dropped) in zip(items, results, strict=True):
            was = trimmed.get(delivery.queue, (0, 0))
            trimmed[delivery.queue] = (was[0] + expired, was[1] + dropped)
        for queue, (expired, dropped) in trimmed.items():
            log_trimmed(b, queue, expired, dropped)

    def defer(self, delivery: Delivery, eta: float) -> None:
        self.defer_many([(delivery, eta)])

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

    def heartbeat(self) -> bool:
        self._touch_slots(self.broker)
        return _beat_reporting(self, self.broker)

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        own = type(self.broker)(
            self.broker._url,
            heartbeat_timeout=self.heartbeat_timeout,
            max_recoveries=self.broker.max_recoveries,
        )

        def beat() -> bool:
            self._touch_slots(own)
            return _beat_reporting(self, own)

        return beat, own.close

    def close(self) -> None:
        if self._pending is not None:  # what it took is in flight: the close script releases it
            with contextlib.suppress(redis.RedisError):
                self._collect()
        script = self.broker._scripts.close
        commands: list[_Command] = []
        for target in self._targets.values():
            k = target.keys
            commands.append(
                self.broker._call(
                    script, (*k.ready, target.inflight, k.workers, k.wake), (self.worker_id,)
                )
            )
            commands.append((("DEL", target.fetched), None))
        commands += self._slot_commands(
            self.broker, ((key, 0, -n) for key, n in self._slots.items())
        )
        self.broker._pipeline(commands, "closing a consumer")
        self._slots.clear()
