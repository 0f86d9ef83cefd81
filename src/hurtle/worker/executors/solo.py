"""``solo``: runs deliveries one after another on the worker's own thread.

The fastest mode for short tasks: no hand-off between threads, one fetch per batch. The batch size
adapts to how long tasks take, so that a batch holds about ``target_batch_seconds`` of work: short
tasks are fetched a thousand at a time, slow ones one at a time.

A slow task never keeps a backlog from workers that are idle: a watchdog thread looks at the
running delivery every ``handback_after`` seconds, and when the same one has run for that long
it hands the rest of the batch, and the batch prefetched for afterwards, back to the broker for
other workers to take (``Acker.release``; on SQLite they go to the back of their priority). The
hot path pays nothing for it: the task loop already records which delivery runs, and takes its
deliveries from a deque that the watchdog takes from the other end, so each is run or handed
back, never both.

Time limits cost the task loop one attribute store per task: the same watchdog interrupts only a
task that overran. When the worker runs on the main thread (``hurtle worker``), the loop records
the running task's limit (``time_limit``), and the watchdog, which wakes often enough for the
shortest limit of the app's tasks, signals the main thread (``SIGALRM``; the handler is
installed once, and passes signals it did not send to the handler it replaced) when the same
delivery has run past it; the handler raises ``TimeLimitExceeded`` in the task where it is, even
in ``time.sleep`` or a socket wait. A task that swallows it and returns is failed all the same
(``overran``). No timer is armed per task, so time-limited tasks run inline. On any other thread
(a worker started with ``run_in_thread``) signals cannot reach it: the task runs to its end and
is failed then if it overran.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from time import monotonic, perf_counter
from types import FrameType
from typing import Any

from ...brokers import Delivery
from ...context import bind, unbind
from ...errors import TaskCancelled, TimeLimitExceeded
from ...message import Message
from ..processor import Job, Processor, late_limit
from .base import Executor

log = logging.getLogger(__name__)


class SoloExecutor(Executor):
    concurrency = 1
    runs_in_submit = True

    def __init__(
        self,
        *,
        max_batch: int = 1000,
        target_batch_seconds: float = 0.05,
        handback_after: float = 0.25,
    ) -> None:
        self.max_batch = max_batch
        self.target = target_batch_seconds
        self.handback_after = handback_after
        self._per_task = target_batch_seconds / 8  # a guess until the first batch is timed
        self._processor: Processor | None = None
        self.stopping = False
        self.current: Delivery | None = None
        self.unstarted: list[Delivery] = []
        self.pending: deque[Delivery] = deque()
        #: The time limit of the task running now (set by the task loop), for the watchdog.
        self.time_limit: float | None = None
        #: Deliveries interrupted at their time limit in the current batch.
        self.overran: list[Delivery] = []
        #: Deliveries handed back because a task ran long (for logs and tests).
        self.handed_back = 0
        self._batch_lock = threading.Lock()  # the watchdog hands back only during a batch
        self._in_batch = False
        self._handed_in_batch = 0
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._tick = handback_after
        self._main: int | None = None  # the thread to signal at a time limit, when we can
        self._previous_alarm: Any = None
        self._stop_text: tuple[Delivery, str] | None = None  # what the alarm handler raises
        # a running delivery ``Hurtle.cancel`` named, and the error to raise in its task
        self._cancel: tuple[Delivery, TaskCancelled] | None = None
        self._signalled = False  # the next SIGALRM is the watchdog's

    def watches_time_limits(self) -> bool:
        return (
            hasattr(signal, "pthread_kill")
            and threading.current_thread() is threading.main_thread()
        )

    def start(self, processor: Processor) -> None:
        self._processor = processor
        if processor.tracker is not None:  # ``hurtle.current()``: the delivery running now
            bind(partial(getattr, self, "current"), processor.tracker)  # no Python frame
        if self.watches_time_limits():  # for tasks registered later too: only this watchdog
            # can stop a time-limited task, since they all run inline
            self._main = threading.get_ident()
            self._previous_alarm = signal.signal(signal.SIGALRM, self._on_alarm)
            limits = [t.time_limit for t in processor.tasks.values() if t.time_limit is not None]
            tick = self.handback_after if self.handback_after > 0 else 0.25
            self._tick = max(min([tick, *(limit / 10 for limit in limits)]), 0.005)
        if self._tick > 0:
            self._watchdog = threading.Thread(
                target=self._watch, name="hurtle-solo-watchdog", daemon=True
            )
            self._watchdog.start()

    def waiting(self) -> list[Delivery]:
        return list(self.pending)  # the running batch's rest (taken from both ends: a copy)

    def wait_for_capacity(self, timeout: float) -> int:
        if self.stopping:
            return 0
        return max(1, min(self.max_batch, int(self.target / max(self._per_task, 1e-7))))

    def submit(self, deliveries: list[Delivery]) -> None:
        processor = self._processor
        assert processor is not None, "start() the executor first"
        started = perf_counter()
        before = len(self.unstarted)
        with self._batch_lock:
            self._in_batch = True
            self._handed_in_batch = 0
        try:
            processor.process_many(deliveries, self)
        finally:
            self.time_limit = None
            self.overran.clear()
            with self._batch_lock:  # waits for a hand-back under way: it may use the consumer
                self._in_batch = False
        done = len(deliveries) - (len(self.unstarted) - before) - self._handed_in_batch
        if done:
            per_task = (perf_counter() - started) / done
            self._per_task = 0.5 * self._per_task + 0.5 * per_task

    def idle(self) -> bool:
        return self.current is None

    def request_stop(self) -> None:
        self.stopping = True  # submit() checks it between deliveries

    def stop(self) -> list[Delivery]:
        self.stopping = True
        unstarted, self.unstarted = self.unstarted, []
        return unstarted

    def join(self, timeout: float) -> bool:
        return True  # tasks run inside submit(): none runs once the fetch loop is out

    def abort(self) -> list[Delivery]:
        self.stopping = True
        out, self.unstarted = self.unstarted, []
        if self.current is not None:
            out.insert(0, self.current)
            self.current = None
        return out

    def running(self) -> int:
        return 0 if self.current is None else 1

    def interrupts_caller(self) -> bool:
        return self.current is not None

    def running_items(self) -> list[Any]:
        current = self.current
        return [] if current is None else [current]

    def cancel_running(self, items: list[Any]) -> None:
        """On the main thread, raise ``TaskCancelled`` in the running task, as its time limit
        would (``SIGALRM``); elsewhere the task sees ``hurtle.current().cancelled``."""
        current = self.current
        if self._main is None or current is None or not any(i is current for i in items):
            return
        try:
            m = Message.decode(current.raw)
            what = f"task {m.task}[{m.id}]"
        except Exception:
            what = "a task"
        self._cancel = (current, TaskCancelled(f"{what} was cancelled while it ran and stopped"))
        if self.current is current:
            self._signalled = True
            signal.pthread_kill(self._main, signal.SIGALRM)

    def close(self) -> None:
        self._closed.set()
        if self._processor is not None and self._processor.tracker is not None:
            unbind()
        if self._main is not None:
            self._main = None
            signal.signal(signal.SIGALRM, self._previous_alarm)

    # -- the watchdog: time limits, and handing back what a slow task holds --------------------

    def _watch(self) -> None:
        seen: Delivery | None = None
        since = 0.0  # when the watchdog first saw ``seen`` run: never after it started
        while not self._closed.wait(self._tick):
            current = self.current
            now = monotonic()
            if current is None or current is not seen:
                seen, since = current, now
                continue
            limit = self.time_limit
            try:
                if limit is not None and now - since >= limit and self._main is not None:
                    self._interrupt(current, limit)
                if self.handback_after > 0 and now - since >= self.handback_after:
                    self._hand_back(current)
            except Exception:  # never let the watchdog die: the worker goes on without it
                log.exception("the solo pool's watchdog could not act on a slow task")

    def _interrupt(self, slow: Delivery, limit: float) -> None:
        """Make the main thread raise ``TimeLimitExceeded`` in ``slow``'s task."""
        if self._stop_text is None or self._stop_text[0] is not slow:
            try:
                m = Message.decode(slow.raw)
                what = f"task {m.task}[{m.id}]"
            except Exception:
                what = "a task"
            self._stop_text = (
                slow,
                f"{what} ran longer than its time limit of {limit:g}s and was stopped",
            )
        if self._main is not None and self.current is slow:
            self._signalled = True
            signal.pthread_kill(self._main, signal.SIGALRM)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if not self._signalled:  # not ours: whoever had SIGALRM before the worker gets it
            previous = self._previous_alarm
            if callable(previous):
                previous(signum, frame)
            return
        self._signalled = False
        cancel = self._cancel
        if cancel is not None and cancel[0] is self.current:
            self._cancel = None
            raise cancel[1]
        stop = self._stop_text
        if stop is not None and stop[0] is self.current and self.time_limit is not None:
            self.overran.append(stop[0])
            raise TimeLimitExceeded(stop[1])

    def _hand_back(self, slow: Delivery) -> None:
        """Give the rest of the batch and the prefetched batch to other workers."""
        processor = self._processor
        assert processor is not None
        acker = processor.acker
        with self._batch_lock:
            if not self._in_batch or self.current is not slow:
                return
            rest: list[Delivery] = []
            take = self.pending.pop
            while True:
                try:
                    rest.append(take())
                except IndexError:
                    break
            rest.reverse()
            self._handed_in_batch += len(rest)
            try:
                rest += acker.consumer.take_prefetched()
            except Exception as err:  # the next fetch meets the problem and reports it
                log.warning("could not take back the prefetched messages: %s", err)
            if not rest:
                return
            self.handed_back += len(rest)
            acker.release(rest)
        log.debug(
            "a task has run for over %gs: %d messages held behind it go back to the "
            "broker for idle workers",
            self.handback_after,
            len(rest),
        )

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        """A time-limited call outside the inline path: the watchdog interrupts it (on the main
        thread), and it is failed if it overran all the same."""
        if self._main is None or threading.get_ident() != self._main:
            return late_limit(job, call)
        self.time_limit = job.task.time_limit
        try:
            return late_limit(job, call)  # late too: in case the task swallowed the alarm
        finally:
            self.time_limit = None
