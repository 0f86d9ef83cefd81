"""``nats://host:4222``: hurtle on NATS JetStream (``names.py`` says how names map).

Messages live in one work-queue stream per queue, pulled in batches by durable consumers
(``consumer.py``); what is not a message lives in JetStream key-value buckets (``store.py``):
workers and their reports, totals, tick claims (a KV create or an update on the revision read:
one writer wins), rate and concurrency limits and unique locks (compare-and-set loops), and
results (buckets by ttl, ``results.py``). Dead letters are a stream per queue
(``deadletters.py``); delayed messages wait in the queue's ``d`` subject until a promoter hands
them to their level (``delays.py``).

Control (``control.py``): one KV record names the paused queues and until when cancellations
are live; every fetch reads it once, beside the levels it pulls, and skips paused queues.
Workflows (``flows.py``): JetStream has no transaction across subjects and buckets, so
``ack_flow`` applies each step in an order where every part is repeatable (results, chord
payloads, a compare-and-set count per chord, the next link and callback published under their
message ids as ``Nats-Msg-Id``, the acknowledgement last). A worker killed part-way leaves its
delivery to come back, and its step publishes the same link or callback again, which JetStream
drops as a duplicate — within the queue streams' duplicate window (``duplicate_window``, two
minutes). A worker recovered later than that (a heartbeat timeout above about a minute) can set
a link or callback off twice. ``purge.py`` empties a queue without touching what workers hold;
``reading.py`` lists the queues and counts what is in them.

Every call runs on the process's one event-loop thread (``loop.py``); each broker has a
connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Unpack

from ...ids import new_id
from ...message import Message, check_messages, check_size, encode_many
from ..base import Broker, BrokerOptions, Consumer
from ..common import (
    check_cancel_ttl,
    check_queue_name,
    dead_ends,
    gcra,
    lock_end,
    log_trimmed,
    unique_key_of,
)
from ..records import DeadLetter, Lock, QueueStats, StoredResult
from ..reports import TaskCounts, WorkerReport, decode_report, merge
from ..ticks import TAKEN, WON, TickBatch, TickClaim, claimable, remember, too_early
from . import control, flows, names, reading, results
from .deadletters import DeadLetters
from .delays import Promoters
from .loop import run
from .options import parse
from .purge import purge
from .recovery import recover_dead_workers
from .store import REPORTS_BUCKET, Store

Item = tuple[str, bytes, dict[str, str] | None]

#: Bytes of the server's ``max_payload`` kept for headers and a dead letter's reason: the rest is
#: ``max_message_size`` and ``max_result_size``.
ROOM = 8 * 1024
#: Longest a new broker waits for its connection (nats-py gives up on a silent server sooner).
CONNECT_TIMEOUT = 30.0


class NatsBroker(Broker):
    def __init__(
        self, url: str = "nats://127.0.0.1:4222", **options: Unpack[BrokerOptions]
    ) -> None:
        super().__init__(**options)
        parsed = parse(url)
        self.url = parsed.url
        self.store: Store = run(
            Store.connect(parsed, max(60.0, 2 * self.heartbeat_timeout)),
            CONNECT_TIMEOUT,
            self.url,
        )
        # what the server takes in one message (its INFO), less room for headers and the
        # reason of a dead letter
        self.max_message_size = self.max_result_size = self.store.nc.max_payload - ROOM
        self.dead = DeadLetters(self.store, self.dead_letter_max, self.dead_letter_ttl)
        self.promoters = Promoters(self.store)
        self._calls = itertools.count()

    # -- publishing ----------------------------------------------------------------------

    def _items(
        self, messages: Sequence[Message], payloads: Sequence[bytes], call: str | None = None
    ) -> list[Item]:
        """Where each message goes: its priority's subject, or the delayed one with its eta;
        each under the ``Nats-Msg-Id`` ``id.attempt.call`` (``call`` a new id unless given)."""
        now = time.time()
        call = call or new_id()
        items: list[Item] = []
        for m, raw in zip(messages, payloads, strict=True):
            level = str(m.priority)
            headers = {names.MSG_ID: f"{m.id}.{m.attempt}.{call}"}
            if m.eta > now:
                headers[names.ETA] = repr(float(m.eta))
                headers[names.PRIORITY] = level
                level = names.DELAYED
            else:
                self.store.note(m.queue, level)
            items.append((names.subject(m.queue, level), raw, headers))
        return items

    async def _publish(self, queues: Iterable[str], items: list[Item]) -> None:
        queues = list(dict.fromkeys(queues))
        await asyncio.gather(*(self.store.ensure_queue(q) for q in queues))
        await self.store.publish_all(items)
        await self.store.wake(queues)

    def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        payloads = encode_many(list(messages), self.max_message_size)
        if messages:
            run(self._publish([m.queue for m in messages], self._items(messages, payloads)))

    def publish_once(
        self,
        messages: Sequence[Message],
        payloads: Sequence[bytes] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        # the same Nats-Msg-Id each time (no call of its own): JetStream stores one per id
        # within the stream's duplicate window, so each message is a unit of its own here
        check_messages(messages)
        if payloads is None:
            payloads = encode_many(list(messages), self.max_message_size)
        else:
            check_size(messages, payloads, self.max_message_size)
        if messages:
            items = self._items(messages, payloads, "outbox")
            run(self._publish([m.queue for m in messages], items))

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        items: list[Item] = [(names.subject(queue, "0"), bytes(p), None) for p in payloads]
        self.store.note(queue, "0")
        run(self._publish([queue], items))

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        check_messages(messages)
        keys = [unique_key_of(m) for m in messages]
        payloads = encode_many(list(messages), self.max_message_size)
        return run(self._publish_unique(messages, keys, payloads, unique_for))

    async def _publish_unique(
        self,
        messages: Sequence[Message],
        keys: list[str],
        payloads: list[bytes],
        unique_for: float,
    ) -> list[str]:
        holders = await self._lock(messages, keys, unique_for)
        chosen = [i for i, m in enumerate(messages) if holders[i] == m.id]
        if chosen:
            picked = [messages[i] for i in chosen]
            await self._publish(
                [m.queue for m in picked], self._items(picked, [payloads[i] for i in chosen])
            )
        return holders

    async def _lock(
        self, messages: Sequence[Message], keys: list[str], unique_for: float
    ) -> list[str]:
        """Take the unique lock of each message whose lock is free (of several messages with
        one lock, the first): per message, the id holding its lock."""
        first: dict[tuple[str, str], int] = {}
        for i, (m, key) in enumerate(zip(messages, keys, strict=True)):
            first.setdefault((m.queue, key), i)

        async def lock(queue: str, key: str, i: int) -> str:
            mine = messages[i].id

            def take(old: Any) -> tuple[Any, str]:
                now = time.time()
                if old is not None and old[1] > now:
                    return old, old[0]
                return [mine, lock_end(messages[i], now, unique_for)], mine

            return await self.store.cas(f"u.{names.token(queue)}.{names.token(key)}", take)

        holders = await asyncio.gather(*(lock(q, k, i) for (q, k), i in first.items()))
        holder = dict(zip(first, holders, strict=True))
        return [holder[(m.queue, key)] for m, key in zip(messages, keys, strict=True)]

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        async def take(key: str, limit: int, period: float, wanted: int) -> tuple[int, float]:
            def change(old: Any) -> tuple[Any, tuple[int, float]]:
                granted, wait, tat = gcra(old or 0.0, time.time(), limit, period, wanted)
                return tat, (granted, wait)

            return await self.store.cas(f"rate.{names.token(key)}", change)

        async def all_() -> list[tuple[int, float]]:
            return list(await asyncio.gather(*(take(*r) for r in requests)))

        return run(all_())

    # -- control -------------------------------------------------------------------------

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        if reports:
            run(results.put_progress(self.store, reports))

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        return run(results.get_progress(self.store, list(ids))) if ids else []

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        ttl = check_cancel_ttl(ttl)
        if ids:
            run(control.cancel(self.store, list(ids), ttl))

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        return run(control.cancelled(self.store, list(ids)))

    def uncancel(self, ids: Sequence[str]) -> None:
        if ids:
            run(control.uncancel(self.store, list(ids)))

    def pause(self, queue: str) -> None:
        run(control.set_paused(self.store, check_queue_name(queue), True))

    def resume(self, queue: str) -> None:
        run(control.set_paused(self.store, check_queue_name(queue), False))

    def paused(self) -> set[str]:
        return run(control.read(self.store))[0]

    # -- workflows -------------------------------------------------------------------------

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        return run(flows.chord_results(self.store, id, total))

    # -- ticks ---------------------------------------------------------------------------

    def _store_tick(self, batch: TickBatch) -> TickClaim:
        return run(self._claim_tick(batch))

    async def _claim_tick(self, batch: TickBatch) -> TickClaim:
        """Judge the tick by the server's clock; take the unique locks if any; publish, under
        ids made of the schedule and the tick (JetStream keeps one copy of what racing claimers
        publish); then record the tick with a compare-and-set."""
        queue, messages, payloads, keys = batch.queue, batch.messages, batch.payloads, batch.keys
        tick = float(batch.tick)
        key = f"t.{names.token(queue)}.{names.token(batch.name)}"
        found = await self.store.get(key)
        if not claimable(tick, *_recent(None if found is None else found[0])):
            return TAKEN
        early = too_early(tick, await self.store.server_time())
        if early is not None:
            return early
        held_by = None
        chosen = list(range(len(messages)))
        if keys is not None:
            assert batch.unique_for is not None
            holders = await self._lock(messages, keys, batch.unique_for)
            chosen = [i for i, m in enumerate(messages) if holders[i] == m.id]
            held_by = next((h for h, m in zip(holders, messages, strict=True) if h != m.id), None)
        if chosen:
            picked = [messages[i] for i in chosen]
            items = self._items(picked, [payloads[i] for i in chosen])
            for i, (_, _, headers) in zip(chosen, list(items), strict=True):
                assert headers is not None
                headers[names.MSG_ID] = f"tick.{key}.{tick!r}.{i}"
            await self._publish([queue], items)

        def claim(old: Any) -> tuple[Any, bool]:
            recent, last = _recent(old)
            if not claimable(tick, recent, last):
                return old, False
            return remember(tick, recent if recent else ([] if last is None else [last])), True

        if not await self.store.cas(key, claim):
            return TAKEN
        return WON if held_by is None else TickClaim(True, held_by=held_by)

    def last_tick(self, queue: str, name: str) -> float | None:
        found = run(self.store.get(f"t.{names.token(queue)}.{names.token(name)}"))
        return None if found is None else _recent(found[0])[1]

    # -- consumers and recovery ------------------------------------------------------------

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> Consumer:
        from .consumer import NatsConsumer

        return NatsConsumer(self, tuple(queues), worker_id or f"nats-{new_id()}")

    async def write_dead(self, queue: str, items: list[tuple[bytes, str]]) -> None:
        """Store dead letters (a worker's: what waits on them was ended by the worker)."""
        expired, dropped = await self.dead.write(queue, items)
        log_trimmed(self, queue, expired, dropped)

    async def write_lost(self, queue: str, items: list[tuple[bytes, str]]) -> None:
        """Dead letters of messages whose workers kept dying, which the broker dead-letters
        itself: what waits on them ends first (``dead_ends``: their records, their workflows',
        their unique locks)."""
        records: list[StoredResult] = []
        locks: list[Lock] = []
        for raw, reason in items:
            found, lock = dead_ends(raw, reason)
            records += found
            if lock is not None:
                locks.append((queue, *lock))
        if records:
            await results.put(self.store, records)
        if locks:
            await self.release_locks(locks)
        await self.write_dead(queue, items)

    async def release_locks(self, locks: Sequence[Lock]) -> None:
        """End the unique locks ``(queue, key, message id, until)`` still held for that id."""
        for queue, key, message_id, _ in locks:

            def change(old: Any, message_id: str = message_id) -> tuple[Any, None]:
                if old is not None and old[0] == message_id:
                    return None, None
                return old, None

            await self.store.cas(f"u.{names.token(queue)}.{names.token(key)}", change)

    def recover(self) -> int:
        return run(recover_dead_workers(self.store, self.max_recoveries, self.write_lost))

    # -- reading (reading.py) --------------------------------------------------------------

    def queues(self) -> list[str]:
        return run(reading.queue_names(self.store))

    def forget(self, queue: str) -> bool:
        return run(reading.forget(self.store, self.dead, check_queue_name(queue)))

    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        chosen = self.queues() if queues is None else list(queues)
        return run(reading.stats(self.store, self.dead, chosen))

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        return run(reading.next_delayed(self.store, queue, limit))

    # -- dead letters ----------------------------------------------------------------------

    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        return run(self.dead.page(queue, limit, offset))

    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        return run(self.dead.find(message_id))

    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        return run(self.dead.delete(queue, list(ids)))

    def _stored_purge(self, queues: Sequence[str]) -> int:
        return sum(run(purge(self.store, queue)) for queue in queues)

    def _stored_purge_dead(self, queue: str) -> int:
        return run(self.dead.purge(queue))

    # -- workers, totals, results -----------------------------------------------------------

    def workers(self) -> list[WorkerReport]:
        return run(self._workers(forget=True))

    async def _workers(self, forget: bool) -> list[WorkerReport]:
        keys = await self.store.keys(REPORTS_BUCKET)
        found = await asyncio.gather(*(self.store.get(k, REPORTS_BUCKET) for k in keys))
        now = time.time()
        kv = await self.store.kv(REPORTS_BUCKET)
        out = []
        for key, entry in zip(keys, found, strict=True):
            if entry is None:
                continue
            (deadline, raw), rev = entry
            if deadline < now:
                if forget:
                    # fails when it beat again meanwhile, or another reader forgot it
                    with contextlib.suppress(Exception):
                        await kv.delete(key, last=rev)
                continue
            report = decode_report(raw, deadline)
            if report is not None:
                out.append(report)
        return sorted(out, key=lambda r: r.id)

    def _stored_reports(self) -> list[str]:
        """Ids of the reports the store holds, whatever their deadline (for tests)."""

        async def held() -> list[str]:
            keys = await self.store.keys(REPORTS_BUCKET)
            found = await asyncio.gather(*(self.store.get(k, REPORTS_BUCKET) for k in keys))
            return [k for k, entry in zip(keys, found, strict=True) if entry is not None]

        return sorted(names.untoken(k) for k in run(held()))

    def totals(self) -> list[TaskCounts]:
        found = run(self.store.get("totals"))
        if found is None:
            return []
        return [TaskCounts(*row) for row in found[0]]

    async def add_totals(self, delta: Sequence[TaskCounts]) -> None:
        def change(old: Any) -> tuple[Any, None]:
            rows = [TaskCounts(*row) for row in old or []]
            merged = merge([*rows, *delta])
            return [
                [c.queue, c.task, c.processed, c.failed, c.retried, c.dead_lettered] for c in merged
            ], None

        await self.store.cas("totals", change)

    def get_result(self, id: str) -> bytes | None:
        return run(results.get(self.store, id))

    async def store_results(self, records: Sequence[StoredResult]) -> None:
        await results.put(self.store, records)

    def watch_results(
        self, ids: Sequence[str], wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        return results.watch(self.store, ids, wake)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            run(self._close(), 10)

    async def _close(self) -> None:
        await self.promoters.stop()
        await self.store.close()


def _recent(record: Any) -> tuple[list[float], float | None]:
    """A schedule's record as ``(its latest claimed ticks, its last tick)``: a list of the
    latest ticks, or (written by an older hurtle) the last tick alone."""
    if record is None:
        return [], None
    if isinstance(record, list):
        ticks = [float(t) for t in record]
        return ticks, (ticks[-1] if ticks else None)
    return [], float(record)
