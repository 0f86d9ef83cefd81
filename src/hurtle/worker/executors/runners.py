"""``RunnerPool``: runners (threads or greenlets) that take work from one buffer.

Shared by the threads, gevent and eventlet executors (items are deliveries) and by the asyncio
executor for its plain ``def`` tasks (items are jobs). The pool owns what those modes have in
common and nothing else: the buffer, how many runners live (between ``min_size`` and
``max_size``, growing when work waits and no runner is idle, retiring a runner idle for
``idle_timeout``), what each runner holds, and graceful or immediate stop. An item whose work
raises (which the processor never lets a task do) goes to ``on_error``, so that it still ends in
an outcome instead of staying in flight until the worker stops; the runner goes on.

It also owns time limits for threads, which cannot be interrupted: a watchdog thread, polling at
a tenth of the shortest limit seen (a call only records its deadline), fails a call that overruns
(``on_expire``), abandons its thread — it is no longer counted, its outcome will be ignored, and
as a daemon it never holds up the process's exit — and starts another in its place.
Greenlet pools override ``limit`` with their own timeouts and never start the watchdog.

Chunks (``work_many``, the threads pool): a runner takes its share of the buffer at once (an even
split between the runners, at most ``max_chunk``) and runs it through ``work_many(items, slot)``
— ``Processor.process_many``, with the slot as its ``BatchState`` — so short tasks cost no
hand-off between threads each. What a chunk has not started stays takeable: a runner that finds
the buffer empty takes half (rounded up) of the longest unstarted rest of another runner's chunk
(so a slow task holds up nothing that an idle runner could run), and ``stop``/``abort`` take
them back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from time import perf_counter
from typing import Any, Generic, TypeVar

from ...context import Tracker, bind, unbind
from ..processor import Job

log = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")
#: Starts ``target`` on a new runner named ``name``.
Spawn = Callable[[Callable[[], None], str], None]


def spawn_thread(target: Callable[[], None], name: str) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


class _Abandoned(BaseException):
    """Raised in a runner whose call was given up at its time limit: record no outcome."""


class _Slot:
    """What one runner holds; in chunk mode also the ``BatchState`` of its chunk."""

    __slots__ = (
        "abandoned",
        "current",
        "deadline",
        "item",
        "job",
        "overran",
        "pending",
        "stopping",
        "time_limit",
        "unstarted",
    )

    def __init__(self) -> None:
        self.item: Any = None
        self.job: Job | None = None
        self.deadline: float | None = None
        self.abandoned = False
        self.stopping = False
        self.current: Any = None
        self.pending: deque[Any] = deque()
        self.unstarted: list[Any] = []
        self.time_limit: float | None = None
        self.overran: list[Any] = []

    def held(self) -> int:
        """Items of the chunk not finished yet (at least 1 while the chunk runs)."""
        return max(len(self.pending) + (self.current is not None), 1)


def _take_right(pending: deque[T], n: int) -> list[T]:
    """Take up to ``n`` items from the right of a deque that another thread takes from the
    left: each is taken exactly once. Returned in their original order."""
    out: list[T] = []
    take = pending.pop
    for _ in range(n):
        try:
            out.append(take())
        except IndexError:
            break
    out.reverse()
    return out


class RunnerPool(Generic[T]):
    def __init__(
        self,
        work: Callable[[T], None],
        *,
        max_size: int,
        min_size: int | None = None,
        spawn: Spawn = spawn_thread,
        name: str = "hurtle-runner",
        idle_timeout: float = 2.0,
        on_expire: Callable[[Job], None] | None = None,
        on_error: Callable[[T, BaseException], None] | None = None,
        work_many: Callable[[list[T], _Slot], None] | None = None,
        max_chunk: int = 256,
        tracker: Tracker | None = None,
    ) -> None:
        #: Where the tasks' ``hurtle.current()`` reports go: bound on each runner as it starts.
        self.tracker = tracker
        self.work = work
        self.work_many = work_many
        self.max_chunk = max_chunk
        #: Seconds per item, averaged over chunks (chunk mode): the threads pool sizes its
        #: fetches by it.
        self.per_item = 1.0  # until measured: fetch one more per runner, as other pools
        self.max_size = max_size
        self.min_size = max_size if min_size is None else min_size
        self.spawn = spawn
        self.name = name
        self.idle_timeout = idle_timeout
        self.on_expire = on_expire
        self.on_error = on_error
        self.cond = threading.Condition()
        self._buffer: deque[T] = deque()
        self._running: dict[_Slot, T] = {}
        self._live = 0
        self._idle = 0
        self._made = 0
        self._stopping = False
        self._local = threading.local()
        self._abandoned = 0
        self._watchdog: threading.Thread | None = None
        self._watch = threading.Event()
        self._tick = 1.0  # the watchdog's period: a tenth of the shortest limit seen

    # -- sizes -----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Runners alive and not abandoned (at least ``min_size`` once started)."""
        return max(self._live, self.min_size)

    def outstanding(self) -> int:
        """Items buffered or running (call with ``cond`` held)."""
        if self.work_many is not None:
            return len(self._buffer) + sum(slot.held() for slot in self._running)
        return len(self._buffer) + len(self._running)

    def waiting(self) -> list[T]:
        """Items buffered, and the rest of each chunk not started yet (a snapshot)."""
        with self.cond:
            return [*self._buffer, *(item for slot in self._running for item in slot.pending)]

    def running(self) -> int:
        """Runners in a call now (a snapshot, read without the lock)."""
        return len(self._running)

    def running_items(self) -> list[Any]:
        """The items in a call now: each chunk's running delivery, or each runner's item."""
        with self.cond:
            slots = list(self._running)
        chunks = self.work_many is not None
        items = [slot.current if chunks else slot.item for slot in slots]
        return [i for i in items if i is not None]

    @property
    def stopping(self) -> bool:
        return self._stopping

    def abandoned(self) -> int:
        with self.cond:
            return self._abandoned

    def start(self) -> None:
        with self.cond:
            self._grow(self.min_size)

    def _grow(self, n: int) -> None:
        """Start ``n`` more runners, up to ``max_size`` (``cond`` held)."""
        for _ in range(min(n, self.max_size - self._live)):
            self._live += 1
            self._made += 1
            self.spawn(self._runner, f"{self.name}-{self._made}")

    # -- work ------------------------------------------------------------------------------

    def submit(self, items: Iterable[T]) -> None:
        with self.cond:
            buffer = self._buffer
            buffer.extend(items)
            waiting = len(buffer) - self._idle
            if waiting > 0:
                self._grow(waiting)
            self.cond.notify(len(buffer))

    def _runner(self) -> None:
        slot = _Slot()
        self._local.slot = slot
        work_many = self.work_many
        if self.tracker is not None:  # ``hurtle.current()``: the item running, of its chunk
            # ``getattr`` through ``partial``: no Python frame per ``current()``
            bind(partial(getattr, slot, "item" if work_many is None else "current"), self.tracker)
        try:
            if work_many is None:
                self._run_items(slot)
            else:
                self._run_chunks(slot, work_many)
        finally:
            if self.tracker is not None:
                unbind()

    def _run_items(self, slot: _Slot) -> None:
        cond = self.cond
        buffer = self._buffer
        running = self._running
        work = self.work
        failed = self._record_failure
        while True:
            with cond:
                self._idle += 1
                while not buffer and not self._stopping:
                    if self._live > self.min_size:
                        if not cond.wait(self.idle_timeout) and not buffer:
                            break  # idle too long above the minimum: retire
                    else:
                        cond.wait()
                self._idle -= 1
                if self._stopping or not buffer:
                    self._live -= 1
                    return
                item = slot.item = buffer.popleft()
                running[slot] = item
            if not self._call(work, item, failed):
                return
            with cond:
                if not self._release(slot):
                    return

    def _run_chunks(self, slot: _Slot, work_many: Callable[[list[T], _Slot], None]) -> None:
        cond = self.cond
        buffer = self._buffer
        running = self._running

        def run_chunk(chunk: list[T]) -> None:
            work_many(chunk, slot)

        def chunk_failed(chunk: list[T], err: BaseException) -> None:
            self._chunk_failed(slot, err)

        while True:
            with cond:
                self._idle += 1
                chunk = self._take_chunk()
                while not chunk and not self._stopping:
                    if self._live > self.min_size:
                        if not cond.wait(self.idle_timeout):
                            chunk = self._take_chunk()
                            if not chunk:
                                break  # idle too long above the minimum: retire
                    else:
                        cond.wait()
                    chunk = self._take_chunk()
                self._idle -= 1
                if self._stopping or not chunk:
                    buffer.extendleft(reversed(chunk))
                    self._live -= 1
                    return
                slot.item = chunk[0]
                running[slot] = chunk[0]
            started = perf_counter()
            if not self._call(run_chunk, chunk, chunk_failed):
                return
            self.per_item = 0.5 * self.per_item + 0.5 * (perf_counter() - started) / len(chunk)
            with cond:
                slot.current = None
                if slot.unstarted:  # left by a stop: ``abort`` hands them back
                    buffer.extend(slot.unstarted)
                    slot.unstarted.clear()
                if not self._release(slot):
                    return

    def _call(
        self, work: Callable[[U], None], arg: U, failed: Callable[[U, BaseException], None]
    ) -> bool:
        """``work(arg)`` in this runner, for both runner loops. What it raises goes to
        ``failed(arg, err)`` and the runner goes on; False if its call was abandoned at a time
        limit (``limit``): its outcome is recorded already, and the runner must exit."""
        try:
            work(arg)
        except _Abandoned:
            with self.cond:
                self._abandoned -= 1
            return False
        except BaseException as err:
            log.exception("%s: unexpected error, the runner goes on", self.name)
            failed(arg, err)
        return True

    def _release(self, slot: _Slot) -> bool:
        """Free ``slot`` once its call is done and wake the runners waiting for one (``cond``
        held); False if ``abort`` gave it up meanwhile: the pool no longer counts it, and its
        runner must exit."""
        if slot.abandoned:
            self._abandoned -= 1
            return False
        self._running.pop(slot, None)
        slot.item = None
        self.cond.notify_all()
        return True

    def _take_chunk(self) -> list[T]:
        """This runner's share of the buffer, or half of another chunk's unstarted rest (with
        ``cond`` held)."""
        buffer = self._buffer
        if buffer:
            n = min(-(-len(buffer) // max(self._live, 1)), self.max_chunk)
            take = buffer.popleft
            return [take() for _ in range(min(n, len(buffer)))]
        if self._stopping:
            return []
        busiest = max(self._running, key=lambda s: len(s.pending), default=None)
        if busiest is None or not busiest.pending:
            return []
        return _take_right(busiest.pending, (len(busiest.pending) + 1) // 2)

    def _chunk_failed(self, slot: _Slot, err: BaseException) -> None:
        """``work_many`` raised (which the processor never lets a task do): the running item
        gets its outcome from ``on_error``, the unstarted go back to the buffer."""
        current, slot.current = slot.current, None
        rest = slot.unstarted + _take_right(slot.pending, len(slot.pending))
        slot.unstarted.clear()
        with self.cond:
            self._buffer.extendleft(reversed(rest))
            self.cond.notify_all()
        if current is not None:
            self._record_failure(current, err)

    def _record_failure(self, item: T, err: BaseException) -> None:
        """Give the item whose work raised ``err`` its outcome (``on_error``), if it can be."""
        if self.on_error is None:
            return
        try:
            self.on_error(item, err)
        except BaseException:
            log.exception("%s: could not record the outcome of a failed item", self.name)

    # -- time limits for threads -----------------------------------------------------------

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        """Run ``call`` in this runner; at ``job``'s time limit, fail and abandon it."""
        limit = job.task.time_limit
        assert limit is not None
        slot: _Slot = self._local.slot
        with self.cond:  # no wake-up per call: the watchdog polls often enough for any limit
            slot.job = job
            slot.deadline = job.started + limit
            if limit / 10 < self._tick:
                self._tick = max(limit / 10, 0.005)
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watchdog_run, name=f"{self.name}-watchdog", daemon=True
                )
                self._watchdog.start()
        try:
            return call()
        finally:
            with self.cond:
                slot.deadline = None
                slot.job = None
                if slot.abandoned:
                    raise _Abandoned()  # the outcome is already recorded, by the watchdog

    def _watchdog_run(self) -> None:
        while True:
            self._watch.clear()
            expired: list[Job] = []
            with self.cond:
                now = time.monotonic()
                nearest: float | None = None
                for slot in list(self._running):
                    deadline = slot.deadline
                    if deadline is None:
                        continue
                    if deadline <= now and slot.job is not None:
                        expired.append(slot.job)
                        self._abandon(slot)
                        if self.work_many is not None:  # its chunk's rest: for other runners
                            rest = _take_right(slot.pending, len(slot.pending))
                            self._buffer.extendleft(reversed(rest))
                    elif nearest is None or deadline < nearest:
                        nearest = deadline
                if expired:
                    self._grow(self.min_size - self._live)
                    self.cond.notify_all()
            for job in expired:
                log.error(
                    "task %s[%s] overran its time limit of %gs; its thread cannot be "
                    "interrupted, so it is abandoned and replaced",
                    job.task.name,
                    job.message.id,
                    job.task.time_limit,
                )
                if self.on_expire is not None:
                    self.on_expire(job)
            wait = self._tick if nearest is None else min(self._tick, nearest - now)
            self._watch.wait(max(wait, 0.001))

    def _abandon(self, slot: _Slot) -> None:
        """Stop counting a running slot: its runner exits when its call returns (``cond`` held)."""
        slot.abandoned = True
        self._running.pop(slot, None)
        self._live -= 1
        self._abandoned += 1

    # -- stopping --------------------------------------------------------------------------

    def stop(self) -> list[T]:
        """Start nothing new; return what was never started."""
        with self.cond:
            self._stopping = True
            unstarted = list(self._buffer)
            self._buffer.clear()
            if self.work_many is not None:  # the chunks' unstarted rests too
                for slot in self._running:
                    slot.stopping = True
                    unstarted += _take_right(slot.pending, len(slot.pending))
            self.cond.notify_all()
        return unstarted

    def join(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self._running, timeout)

    def abort(self) -> list[T]:
        """Give up on every running item and return it, with what was never started.

        A time-limited call given up this way records no outcome; any other may still record one
        if it ends before the worker exits (harmless: the broker ignores settling what it was
        handed back).
        """
        with self.cond:
            self._stopping = True
            if self.work_many is not None:
                out = []
                for slot in self._running:
                    slot.stopping = True
                    current = slot.current
                    out += ([current] if current is not None else []) + _take_right(
                        slot.pending, len(slot.pending)
                    )
                out += self._buffer
            else:
                out = list(self._running.values()) + list(self._buffer)
            self._buffer.clear()
            for slot in list(self._running):
                self._abandon(slot)
            self.cond.notify_all()
        return out
