"""Sharded queues: one logical queue stored as several queues of any broker, as a layer over
the contract.

A queue ``q`` given ``n`` shards (``ShardedBroker(inner, {"q": n})``, or
``Hurtle(shards={"q": n})``) is stored as ``n`` queues of ``inner`` named ``q~K``
(``shard_names``): ``~`` is outside the alphabet of a user's queue name (``names.py``), so no
user queue is ever one of them. On Redis each has a hash tag of its own; ``K`` is chosen so that
the ``n`` tags fall in ``n`` different stretches of Redis Cluster's 16384 slots, so that a
cluster whose masters hold stretches of slots, as ``redis-cli --cluster create`` makes them,
puts them on more than one master (the first and the last shard never share one when ``n``
shards meet at most ``n`` masters of equal stretches).

What this layer does, and only this:

* publish: a batch's messages of ``q`` are dealt round robin over its shards, from a random
  start, and the whole batch goes to ``inner`` in one call; a message that takes a unique lock
  and a schedule's ticks go to the queue's first shard, so that one key always meets one lock
  and one record dedups a schedule's ticks, whatever the key or the schedule;
* fetch: a consumer of ``q`` is one consumer of ``inner`` on all of ``q``'s shards, starting at
  a random one (each worker favours another shard), then on ``q`` itself (what a sender not
  told of the shards sent), priorities honoured within each, and no further shard once it took
  a message a shard let out of quarantine (``Consumer.fetch``: one a fetch, as for ``q`` alone);
  its deliveries name ``q`` and hold the bytes published (``ShardedConsumer``);
* admin: pause, resume, purge, forget, stats, queues, dead letters and the workers' figures act
  on ``q`` as a whole, shards and ``q`` itself (sums, merged lists), and name ``q``, never a
  shard;
* everything keyed by message id (results, progress, cancellation, rate limits) passes through.

Order holds within a shard only: two messages of ``q`` published one after the other may run in
either order, and a fetch's batch is filled from one shard before the next, so a message of
higher priority in another shard may wait for that batch. Only the stored copy names its shard
(inner's own tools, ``redis-cli``, see ``q~K``).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache

import msgspec

from ..counts import check_counts
from ..message import Message, check_messages, encode_many, lock_of
from ..names import SHARD_MARK, check_queue_name
from .base import Broker
from .records import DeadLetter, QueueStats, StoredResult
from .reports import TaskCounts, WorkerReport
from .sharded_consumer import ShardedConsumer, logical, requeued
from .ticks import TickBatch, TickClaim, check_tick_claim

#: Most shards of one queue.
MAX_SHARDS = 1024
_SLOTS = 16384  # Redis Cluster's hash slots
#: Most bytes a shard's name adds to a stored message: a message of ``max_message_size``
#: bytes as published is taken by inner, whose limit is this much higher.
_SLACK = 8


def check_shards(shards: object) -> dict[str, int]:
    """``shards`` ({queue name: number of shards}), checked: names as ``check_queue_name``,
    numbers whole, 1 to ``MAX_SHARDS``; else a ``ConfigurationError`` naming the value."""
    return check_counts(
        shards,
        MAX_SHARDS,
        what="shards",
        shape="queue name -> number of shards, e.g. {'emails': 4}",
        rule="the number of shards of a queue is a whole number",
        name=check_queue_name,
    )


def crc16(data: bytes) -> int:
    """CRC16/XMODEM, the hash Redis Cluster takes a key's slot from (modulo 16384)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


@lru_cache(maxsize=1024)
def shard_names(queue: str, count: int) -> tuple[str, ...]:
    """The names of the queues that store ``queue``'s ``count`` shards, in shard order: shard
    ``i`` is ``queue~K`` for the least ``K`` whose Redis Cluster slot lies in the ``i``-th of
    ``count`` equal stretches of the slots. A pure function of its arguments: every process
    finds the same names."""
    names: list[str] = []
    k = 0
    for i in range(count):
        low, high = i * _SLOTS // count, (i + 1) * _SLOTS // count
        while True:
            name = f"{queue}{SHARD_MARK}{k}"
            k += 1
            if low <= crc16(name.encode()) % _SLOTS < high:
                names.append(name)
                break
    return tuple(names)


class ShardedBroker(Broker):
    """``inner`` with the queues of ``shards`` ({queue: number of shards}) stored sharded."""

    def __init__(self, inner: Broker, shards: Mapping[str, int]) -> None:
        # no Broker.__init__: the shared options are inner's, read through the properties below
        self.inner = inner
        self.shards = check_shards(shards)
        self.url = inner.url

    # -- the options every broker has, kept by inner ----------------------------------------

    @property
    def heartbeat_timeout(self) -> float:
        return self.inner.heartbeat_timeout

    @heartbeat_timeout.setter
    def heartbeat_timeout(self, value: float) -> None:
        self.inner.heartbeat_timeout = value

    @property
    def dead_letter_max(self) -> int:
        return self.inner.dead_letter_max

    @dead_letter_max.setter
    def dead_letter_max(self, value: int) -> None:
        self.inner.dead_letter_max = value

    @property
    def dead_letter_ttl(self) -> float:
        return self.inner.dead_letter_ttl

    @dead_letter_ttl.setter
    def dead_letter_ttl(self, value: float) -> None:
        self.inner.dead_letter_ttl = value

    @property
    def max_recoveries(self) -> int:
        return self.inner.max_recoveries

    @max_recoveries.setter
    def max_recoveries(self, value: int) -> None:
        self.inner.max_recoveries = value

    @property
    def result_batches(self) -> bool:
        return self.inner.result_batches

    @result_batches.setter
    def result_batches(self, value: bool) -> None:
        self.inner.result_batches = value

    @property
    def max_message_size(self) -> int:
        return self.inner.max_message_size - _SLACK

    @max_message_size.setter
    def max_message_size(self, value: int) -> None:
        self.inner.max_message_size = value + _SLACK

    @property
    def max_result_size(self) -> int:
        return self.inner.max_result_size

    @max_result_size.setter
    def max_result_size(self, value: int) -> None:
        self.inner.max_result_size = value

    # -- names ----------------------------------------------------------------------------

    def shards_of(self, queue: str) -> tuple[str, ...]:
        """The queues of ``inner`` that messages of ``queue`` are sent to: its shards, or
        itself when it is not sharded."""
        count = self.shards.get(queue)
        return (queue,) if count is None else shard_names(queue, count)

    def stored(self, queue: str) -> tuple[str, ...]:
        """The queues of ``inner`` that may hold messages of ``queue``: its shards and, for a
        sharded queue, the queue of its own name too (what a sender that was not told of the
        shards, or that ran before they were set, sent), which workers read after the shards
        and every count and action includes: nothing sent there is left behind."""
        shards = self.shards_of(queue)
        return shards if queue not in self.shards else (*shards, queue)

    def lock_shard(self, queue: str) -> str:
        """The stored queue where the unique locks of ``queue`` live: its first shard."""
        return self.shards_of(queue)[0]

    def route(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` with each message of a sharded queue given a shard: the first when it
        takes a unique lock, else the next of its queue's, dealt from a random start."""
        turns: dict[str, int] = {}
        routed: list[Message] = []
        for m in messages:
            if m.queue not in self.shards:
                routed.append(m)  # not sharded, or a shard's name already (a retried message)
                continue
            names = self.shards_of(m.queue)
            if lock_of(m) is not None:
                shard = names[0]  # where the queue's unique locks live
            else:
                turn = turns.get(m.queue)
                if turn is None:
                    turn = random.randrange(len(names))
                turns[m.queue] = turn + 1
                shard = names[turn % len(names)]
            routed.append(msgspec.structs.replace(m, queue=shard))
        return routed

    def _fold_stats(self, stats: Mapping[str, QueueStats]) -> dict[str, QueueStats]:
        folded: dict[str, QueueStats] = {}
        for name, s in stats.items():
            queue = logical(name)
            before = folded.get(queue)
            if before is not None:
                s = QueueStats(
                    ready=before.ready + s.ready,
                    delayed=before.delayed + s.delayed,
                    in_flight=before.in_flight + s.in_flight,
                    dead=before.dead + s.dead,
                    paused=before.paused or s.paused,
                )
            folded[queue] = s
        return folded

    # -- publishing -----------------------------------------------------------------------

    def _checked(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` routed, once checked and sized as published (errors name those)."""
        check_messages(messages)
        encode_many(list(messages), self.max_message_size)
        return self.route(messages)

    def publish(self, messages: Sequence[Message]) -> None:
        self.inner.publish(self._checked(messages))

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        return self.inner.publish_unique(self._checked(messages), unique_for)

    def publish_in(
        self, connection: object, messages: Sequence[Message], unique_for: float | None = None
    ) -> list[str]:
        return self.inner.publish_in(connection, self._checked(messages), unique_for)

    def publish_once(
        self,
        messages: Sequence[Message],
        payloads: Sequence[bytes] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        """``publish_once`` of ``inner``, each message of a sharded queue in the shard its id
        picks: a batch published again (the outbox's relay) meets the keys it stored before, in
        the same shard (a unit's key in each shard is its first message there)."""
        if payloads is None:
            check_messages(messages)
            payloads = encode_many(list(messages), self.max_message_size)
        routed: list[Message] = []
        stored: list[bytes] = []
        for m, raw in zip(messages, payloads, strict=True):
            if m.queue in self.shards:
                names = self.shards_of(m.queue)
                shard = names[zlib.crc32(m.id.encode()) % len(names)]
                m, raw = msgspec.structs.replace(m, queue=shard), requeued(raw, shard)
            routed.append(m)
            stored.append(raw)
        self.inner.publish_once(routed, stored, units)

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        names = self.shards_of(queue)
        start = random.randrange(len(names))
        for i, name in enumerate(names):
            part = payloads[(i - start) % len(names) :: len(names)]
            if part:
                self.inner.publish_raw(name, part)

    def claim_tick(
        self,
        queue: str,
        name: str,
        tick: float,
        messages: Sequence[Message],
        unique_for: float | None = None,
    ) -> TickClaim:
        check_tick_claim(queue, tick, messages, unique_for)
        check_messages(messages)
        encode_many(list(messages), self.max_message_size)
        shard = self.lock_shard(queue)  # a queue's schedules live with its unique locks
        shifted = [msgspec.structs.replace(m, queue=shard) for m in messages]
        return self.inner.claim_tick(shard, name, tick, shifted, unique_for)

    def _store_tick(self, batch: TickBatch) -> TickClaim:
        raise AssertionError("ShardedBroker.claim_tick hands ticks to its inner broker whole")

    def last_tick(self, queue: str, name: str) -> float | None:
        return self.inner.last_tick(self.lock_shard(queue), name)

    # -- control --------------------------------------------------------------------------

    def pause(self, queue: str) -> None:
        for name in self.stored(check_queue_name(queue)):
            self.inner.pause(name)

    def resume(self, queue: str) -> None:
        for name in self.stored(check_queue_name(queue)):
            self.inner.resume(name)

    def paused(self) -> set[str]:
        return {logical(name) for name in self.inner.paused()}

    def purge(self, queue: str) -> int:
        return sum(self.inner.purge(name) for name in self.stored(check_queue_name(queue)))

    def forget(self, queue: str) -> bool:
        return all([self.inner.forget(name) for name in self.stored(check_queue_name(queue))])

    # -- reading --------------------------------------------------------------------------

    def queues(self) -> list[str]:
        return sorted({logical(name) for name in self.inner.queues()})

    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        if queues is None:
            return self._fold_stats(self.inner.stats())
        wanted = list(queues)
        stored = [name for q in wanted for name in self.stored(q)]
        folded = self._fold_stats(self.inner.stats(stored))
        return {q: folded[q] for q in wanted if q in folded}

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        found: list[tuple[float, bytes]] = []
        for name in self.stored(queue):
            part = self.inner.next_delayed(name, limit)
            if part is None:
                return None
            found.extend(part)
        return sorted(found, key=lambda item: item[0])[:limit]

    def workers(self) -> list[WorkerReport]:
        return [
            msgspec.structs.replace(
                w,
                queues=tuple(dict.fromkeys(map(logical, w.queues))),
                counts=tuple(_fold_counts(w.counts)),
            )
            if any(SHARD_MARK in q for q in (*w.queues, *(c.queue for c in w.counts)))
            else w
            for w in self.inner.workers()
        ]

    def totals(self) -> list[TaskCounts]:
        return sorted(_fold_counts(self.inner.totals()), key=lambda c: (c.queue, c.task))

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(self, queue: str, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        names = self.stored(queue)
        if len(names) == 1:
            return [_named(d) for d in self.inner.dead_letters(names[0], limit, offset)]
        merged = [d for name in names for d in self.inner.dead_letters(name, limit + offset, 0)]
        merged.sort(key=lambda d: d.failed_at)
        return [_named(d) for d in merged[offset : offset + limit]]

    def find_dead(self, message_id: str) -> DeadLetter | None:
        found = self.inner.find_dead(message_id)
        return None if found is None else _named(found)

    def delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        return sum(self.inner.delete_dead(name, ids) for name in self.stored(queue))

    def purge_dead(self, queue: str) -> int:
        return sum(self.inner.purge_dead(name) for name in self.stored(queue))

    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        raise AssertionError("ShardedBroker reads dead letters through its inner broker's")

    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        raise AssertionError("ShardedBroker reads dead letters through its inner broker's")

    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        raise AssertionError("ShardedBroker deletes dead letters through its inner broker")

    def _stored_purge_dead(self, queue: str) -> int:
        raise AssertionError("ShardedBroker deletes dead letters through its inner broker")

    # -- workers --------------------------------------------------------------------------

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> ShardedConsumer:
        stored: list[str] = []
        for queue in queues:
            names = self.shards_of(queue)
            start = random.randrange(len(names))
            stored.extend(names[start:] + names[:start])
            if queue in self.shards:
                stored.append(queue)  # what was sent unsharded: read last
        return ShardedConsumer(self, tuple(queues), self.inner.consumer(stored, worker_id))

    def recover(self) -> int:
        return self.inner.recover()

    # -- what is keyed by message id: passed through ------------------------------------

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        return self.inner.take_tokens(requests)

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        self.inner.cancel(ids, ttl)

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        return self.inner.cancelled(ids)

    def cancellations_live(self) -> bool:
        return self.inner.cancellations_live()

    def uncancel(self, ids: Sequence[str]) -> None:
        self.inner.uncancel(ids)

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        self.inner.put_progress(reports)

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        return self.inner.get_progress(ids)

    def get_result(self, id: str) -> bytes | None:
        return self.inner.get_result(id)

    def watch_results(
        self, ids: Sequence[str], wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        return self.inner.watch_results(ids, wake)

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        return self.inner.chord_results(id, total)

    def close(self) -> None:
        self.inner.close()


def _named(dead: DeadLetter) -> DeadLetter:
    """``dead`` as its logical queue holds it: naming that queue, not its shard, in its own
    field and in its message's."""
    queue = logical(dead.queue)
    if queue == dead.queue:
        return dead
    return msgspec.structs.replace(dead, queue=queue, raw=requeued(dead.raw, queue))


def _fold_counts(counts: Iterable[TaskCounts]) -> list[TaskCounts]:
    """``counts`` summed per logical queue and task, in the order first met."""
    folded: dict[tuple[str, str], TaskCounts] = {}
    for c in counts:
        key = (logical(c.queue), c.task)
        before = folded.get(key)
        folded[key] = (
            msgspec.structs.replace(c, queue=key[0])
            if before is None
            else TaskCounts(
                key[0],
                c.task,
                before.processed + c.processed,
                before.failed + c.failed,
                before.retried + c.retried,
                before.dead_lettered + c.dead_lettered,
            )
        )
    return list(folded.values())
