"""One worker's session on NATS: pulls by level, a record of what it holds, settling by batch.

A fetch pulls the queues in the order given and each queue's levels from quarantine down to
priority 0 (only the levels that may hold messages, ``Store.levels``), skipping the queues the
control record says are paused (read once per fetch, ``control.py``), and no further queue once
one's quarantine gave its message (a fetch holds one such message at most); then it writes the
worker's record (its deadline and the ack subjects it holds) with a compare-and-set on the
revision it wrote last. A record gone or changed means a recoverer declared this worker dead:
what it held went back, so it forgets it (settling it later does nothing) and starts a fresh
record with what it took since.

Acknowledgements are pipelined per batch (``Store.settle``); workflow steps are settled by
``flows.py``. An acknowledgement that carries records first writes the worker's record (one
compare-and-set a batch, as ``flows.py`` does): the records of deliveries a recoverer took are
not stored, so a worker taken for dead does not replace those of the copies delivered again.
The window left is between that write and the records' puts: a worker paused or cut off exactly
there, past its heartbeat timeout, stores its records late. A beat stores the worker's report,
pushes its deadline, tells JetStream the held messages are in progress (``+WPI``, which restarts
their ``AckWait``: a slow task on a live worker is never redelivered) and recovers dead workers.
A blocked fetch waits on the queues' wake subjects, and asks again at least once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js.errors import BadRequestError, KeyWrongLastSequenceError

from ...message import Message, check_messages
from ..base import Consumer
from ..common import lost_reason
from ..records import Delivery, FlowStep, Lock, StoredResult
from ..reports import encode_report
from . import control, flows, names
from .loop import run
from .pull import Puller
from .recovery import recover_dead_workers
from .store import REPORTS_BUCKET, WORKERS_BUCKET

if TYPE_CHECKING:
    from .broker import NatsBroker

#: Longest a blocked fetch waits for a wake-up before it pulls again (seconds).
WAKE_POLL = 1.0


class _Held(msgspec.Struct, gc=False):
    queue: str
    level: str
    deaths: str | None
    raw: bytes


class NatsConsumer(Consumer):
    def __init__(self, broker: NatsBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.store = broker.store
        self.queues = queues
        self.worker_id = worker_id
        self.heartbeat_timeout = broker.heartbeat_timeout
        self._key = names.token(worker_id)
        # ack subject -> where it came from; settled from the worker's threads, filled on the
        # loop: a lock around every change and copy
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._rev = 0  # revision of this worker's record we wrote last
        self._deadline = 0.0
        self._wake: asyncio.Event | None = None
        # one record write at a time (a fetch's and a beat's): a failed compare-and-set then
        # means a recoverer took the record, never that our own other write came first
        self._writing: asyncio.Lock | None = None
        self._subs: list[Any] = []
        self._puller: Puller | None = None
        # deliveries a fetch pulled but could not return (the server failed before it recorded
        # them): held, and returned by the next fetch, so that JetStream never counts them as
        # redelivered (a redelivery counts as a worker's death, ``max_recoveries``)
        self._unreturned: list[Delivery] = []
        run(self._start())

    async def _start(self) -> None:
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()
        self._puller = Puller(self.store.nc)
        await self._puller.start()
        await asyncio.gather(*(self.store.ensure_queue(q) for q in self.queues))
        wake = self._wake

        async def on_wake(_: Any) -> None:
            wake.set()

        for q in dict.fromkeys(self.queues):
            self._subs.append(await self.store.nc.subscribe(names.wake_subject(q), cb=on_wake))
            self.broker.promoters.start(q)
        self._deadline = time.time() + self.heartbeat_timeout
        await self._write_record([])

    # -- the record ------------------------------------------------------------------------

    async def _write_record(self, fresh: Sequence[str]) -> None:
        """Store the deadline and what is held; if a recoverer took the record, forget what it
        recovered and keep only ``fresh`` (taken since)."""
        assert self._writing is not None
        async with self._writing:
            await self._write_record_now(fresh)

    async def _write_record_now(self, fresh: Sequence[str]) -> None:
        kv = await self.store.kv(WORKERS_BUCKET)
        with self._lock:
            value = {"deadline": self._deadline, "held": list(self._held)}
        if self._rev:
            try:
                self._rev = await kv.update(self._key, _pack(value), last=self._rev)
                return
            except (KeyWrongLastSequenceError, BadRequestError):
                pass  # declared dead: what we held is someone else's now
            keep = set(fresh)
            with self._lock:
                for reply in [r for r in self._held if r not in keep]:
                    del self._held[reply]
                value["held"] = list(self._held)
        self._rev = await kv.put(self._key, _pack(value))

    # -- fetching --------------------------------------------------------------------------

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        return run(self._fetch(max_count, timeout))

    async def _fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._wake.clear()
            out = await self._take(max_count)
            left = deadline - loop.time()
            if out or left <= 0:
                return out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(left, WAKE_POLL))

    async def _take(self, max_count: int) -> list[Delivery]:
        out: list[Delivery] = []
        fresh: list[str] = []
        dead: list[tuple[str, str, bytes, str]] = []
        # the control record (paused queues, live cancellations) read beside the levels
        (paused, cancels), levels = await asyncio.gather(
            control.read(self.store), asyncio.gather(*(self.store.levels(q) for q in self.queues))
        )
        # what a failed fetch pulled comes first (still held, kept in progress by the beats)
        out += self._unreturned[:max_count]
        del self._unreturned[:max_count]
        fresh += [d.receipt for d in out]
        try:
            await self._pull_into(out, fresh, dead, max_count, paused, levels)
            if fresh:
                await self._write_record(fresh)
        except BaseException:
            self._unreturned[:0] = out
            raise
        if fresh:
            with self._lock:
                out = [d for d in out if d.receipt in self._held]
            self.cancellations = control.live(cancels, time.time())
        for queue, reply, raw, reason in dead:
            await self.broker.write_lost(queue, [(bytes(raw), reason)])
            await self.store.settle([reply], b"+TERM")
        return out

    async def _pull_into(
        self,
        out: list[Delivery],
        fresh: list[str],
        dead: list[tuple[str, str, bytes, str]],
        max_count: int,
        paused: set[str],
        levels: Sequence[Sequence[str]],
    ) -> None:
        """Pull up to ``max_count`` messages of the queues, by level: each one held (in
        ``out`` and ``fresh``), or one redelivered past ``max_recoveries`` (in ``dead``)."""
        puller = self._puller
        assert puller is not None
        limit = self.broker.max_recoveries
        for queue, queue_levels in zip(self.queues, levels, strict=True):
            if queue in paused:
                continue
            start = len(out)
            probed = False  # took its quarantine's one message let out
            for level in queue_levels:
                want = max_count - len(out)
                if want <= 0:
                    break
                if level == names.QUARANTINE:
                    want = 1
                for msg in await puller.pull(queue, level, want):
                    reply = msg.reply
                    headers = msg.headers
                    deaths = headers.get(names.DEATHS) if headers else None
                    _, _, delivered, _ = names.parse_reply(reply)
                    died = int(deaths or 0) + delivered - 1
                    if delivered > 1 and died > limit:
                        # JetStream redelivered it past max_recoveries (its AckWait lapsed
                        # each time): the workers holding it died before naming it
                        dead.append((queue, reply, msg.data, lost_reason(died, limit)))
                        continue
                    with self._lock:
                        self._held[reply] = _Held(queue, level, deaths, msg.data)
                    fresh.append(reply)
                    out.append(Delivery(queue, msg.data, reply))
                probed = probed or (level == names.QUARANTINE and len(out) > start)
            if len(out) >= max_count or probed:
                break  # full, or it holds a message let out of quarantine: alone of those

    # -- settling --------------------------------------------------------------------------

    def _take_held(self, deliveries: Sequence[Delivery]) -> list[tuple[str, _Held]]:
        out = []
        with self._lock:
            for d in deliveries:
                held = self._held.pop(d.receipt, None)
                if held is not None:
                    out.append((d.receipt, held))
        return out

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        riding = min(len(results), len(deliveries))
        if riding:  # a recoverer took the record: what it held is forgotten, records too
            run(self._write_record([]))
        taken = self._take_held(deliveries)
        if riding and len(taken) < len(deliveries):
            held = {receipt for receipt, _ in taken}
            results = [
                r for i, r in enumerate(results) if i >= riding or deliveries[i].receipt in held
            ]
        if taken or results:
            try:
                run(self._ack([r for r, _ in taken], results))
            except BaseException:  # still held: kept in progress, handed back at close
                with self._lock:
                    self._held.update(taken)
                raise

    async def _ack(self, replies: list[str], results: Sequence[StoredResult]) -> None:
        if results:
            await self.broker.store_results(results)
        await self.store.settle(replies, b"+ACK")

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        payloads: dict[str, bytes] = {}  # encoded first: a message that cannot be settles nothing
        for step in steps:
            out = [*step.publish, *([step.chord.callback] if step.chord is not None else [])]
            check_messages(out)
            # a chord's callback, shared by its members' steps, is encoded once
            payloads.update((m.id, m.encode()) for m in out if m.id not in payloads)
        if steps:
            run(flows.ack_flow(self, steps, payloads))

    def retry(self, delivery: Delivery, message: Message) -> None:
        raw = message.encode()
        taken = self._take_held([delivery])
        if taken:
            items = self.broker._items([message], [raw])
            run(self._replace(taken, [message.queue], items))

    async def _replace(
        self,
        taken: list[tuple[str, _Held]],
        queues: list[str],
        items: list[tuple[str, bytes, dict[str, str] | None]],
    ) -> None:
        """Publish what replaces held deliveries, then acknowledge them."""
        await self.broker._publish(queues, items)
        await self.store.settle([r for r, _ in taken], b"+ACK")

    def defer(self, delivery: Delivery, eta: float) -> None:
        self.defer_many([(delivery, eta)])

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        now = time.time()
        taken: list[tuple[str, _Held]] = []
        out: list[tuple[str, bytes, dict[str, str] | None]] = []
        for delivery, eta in items:
            got = self._take_held([delivery])
            if not got:
                continue
            taken += got
            out.append(self._back(got[0][1], delivery.raw, eta, now))
        if taken:
            run(self._replace(taken, [h.queue for _, h in taken], out))

    def _back(
        self, held: _Held, raw: bytes, eta: float, now: float
    ) -> tuple[str, bytes, dict[str, str] | None]:
        """A held message put back unchanged, at its level or delayed until ``eta``."""
        headers: dict[str, str] = {}
        if held.deaths is not None:
            headers[names.DEATHS] = held.deaths
        level = held.level
        if level == names.QUARANTINE:
            level = "0"
            with contextlib.suppress(Exception):
                level = str(Message.decode(raw).priority)
        if eta > now:
            headers[names.ETA] = repr(float(eta))
            headers[names.PRIORITY] = level
            level = names.DELAYED
        else:
            self.store.note(held.queue, level)
        return names.subject(held.queue, level), raw, headers or None

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        taken = self._take_held([delivery])
        if taken:
            run(self._dead_letter(delivery, reason, taken))

    async def _dead_letter(
        self, delivery: Delivery, reason: str, taken: list[tuple[str, _Held]]
    ) -> None:
        await self.broker.write_dead(delivery.queue, [(delivery.raw, reason)])
        await self.store.settle([r for r, _ in taken], b"+ACK")

    def release(self, deliveries: Sequence[Delivery]) -> None:
        now = time.time()
        taken = self._take_held(deliveries)
        if taken:
            out = [self._back(h, h.raw, 0.0, now) for _, h in taken]
            run(self._replace(taken, [h.queue for _, h in taken], out))

    # -- limits ----------------------------------------------------------------------------

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        return run(self._acquire_slots(requests))

    async def _acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        me = self.worker_id
        out = []
        for key, limit, wanted in requests:
            found = await self.store.get(f"slot.{names.token(key)}")
            holders = list(found[0]) if found is not None else []
            alive = await self._alive([w for w in holders if w != me])

            def change(
                old: Any, alive: set[str] = alive, wanted: int = wanted, limit: int = limit
            ) -> tuple[Any, int]:
                held = {w: n for w, n in (old or {}).items() if w == me or w in alive}
                granted = max(0, min(wanted, limit - sum(held.values())))
                if granted:
                    held[me] = held.get(me, 0) + granted
                return held or None, granted

            out.append(await self.store.cas(f"slot.{names.token(key)}", change))
        return out

    async def _alive(self, workers: list[str]) -> set[str]:
        now = time.time()
        found = await asyncio.gather(
            *(self.store.get(names.token(w), WORKERS_BUCKET) for w in workers)
        )
        return {w for w, f in zip(workers, found, strict=True) if f and f[0]["deadline"] >= now}

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        async def release() -> None:
            for key, count in releases:

                def change(old: Any, count: int = count) -> tuple[Any, None]:
                    held = dict(old or {})
                    left = held.get(self.worker_id, 0) - count
                    if left > 0:
                        held[self.worker_id] = left
                    else:
                        held.pop(self.worker_id, None)
                    return held or None, None

                await self.store.cas(f"slot.{names.token(key)}", change)

        run(release())

    def release_unique(self, locks: Sequence[Lock]) -> None:
        run(self.broker.release_locks(locks))

    # -- liveness --------------------------------------------------------------------------

    def heartbeat(self) -> bool:
        with self._reporting() as report:
            run(self._beat(report))
        return False

    async def _beat(self, report: Any) -> None:
        self._deadline = time.time() + self.heartbeat_timeout
        with self._lock:
            held = list(self._held)
        # the beat itself, at once: in progress, the record, the report and its counts
        steps = [self.store.settle(held, b"+WPI"), self._write_record([])]
        if report is not None:
            steps.append(self._report(report))
        await asyncio.gather(*steps)
        # then the chores of every beat: forget dead workers' reports, recover their messages
        chores: list[Coroutine[Any, Any, object]] = [
            recover_dead_workers(self.store, self.broker.max_recoveries, self.broker.write_lost)
        ]
        if report is not None:
            chores.append(self.broker._workers(forget=True))
        await asyncio.gather(*chores)

    def send_report(self) -> None:
        with self._reporting() as report:
            if report is not None:
                run(self._report(report))

    async def _report(self, report: Any) -> None:
        kv = await self.store.kv(REPORTS_BUCKET)
        await kv.put(names.token(self.worker_id), _pack([self._deadline, encode_report(report)]))
        if report.delta:
            await self.broker.add_totals(report.delta)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            run(self._close(), 30)

    async def _close(self) -> None:
        reporter = self.reporter
        if reporter is not None:  # leaves with its last counts in the totals
            report = reporter.report()
            if report.delta:
                await self.broker.add_totals(report.delta)
            reporter.confirm(report)
            kv = await self.store.kv(REPORTS_BUCKET)
            with contextlib.suppress(Exception):
                await kv.delete(names.token(self.worker_id))
        with self._lock:
            held = list(self._held.items())
            self._held.clear()
        if held:
            now = time.time()
            out = [self._back(h, h.raw, 0.0, now) for _, h in held]
            await self._replace(held, [h.queue for _, h in held], out)
        kv = await self.store.kv(WORKERS_BUCKET)
        # fails when a recoverer took it: what we held went back already
        with contextlib.suppress(Exception):
            await kv.delete(self._key, last=self._rev)
        for sub in self._subs:
            await sub.unsubscribe()
        if self._puller is not None:
            await self._puller.stop()


def _pack(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)
