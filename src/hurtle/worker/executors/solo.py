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

Time limits: when the worker runs on the main thread (``hurtle worker``), a ``SIGALRM`` timer
raises ``TimeLimitExceeded`` in the task where it is, even in ``time.sleep`` or a socket wait. On
any other thread (a worker started with ``run_in_thread``) signals cannot reach it: the task runs
to its end and is failed then if it overran.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter
from types import FrameType
from typing import Any

from ...brokers import Delivery
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
        #: Deliveries handed back because a task ran long (for logs and tests).
        self.handed_back = 0
        self._batch_lock = threading.Lock()  # the watchdog hands back only during a batch
        self._in_batch = False
        self._handed_in_batch = 0
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    def start(self, processor: Processor) -> None:
        self._processor = processor
        if self.handback_after > 0:
            self._watchdog = threading.Thread(
                target=self._watch, name="hurtle-solo-watchdog", daemon=True
            )
            self._watchdog.start()

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

    def interrupts_caller(self) -> bool:
        return self.current is not None

    def close(self) -> None:
        self._closed.set()

    # -- handing back what a slow task holds ---------------------------------------------------

    def _watch(self) -> None:
        seen: Delivery | None = None
        while not self._closed.wait(self.handback_after):
            current = self.current
            if current is None or current is not seen:
                seen = current
                continue
            try:
                self._hand_back(current)
            except Exception:  # never let the watchdog die: the worker goes on without it
                log.exception("could not hand back the messages held behind a slow task")

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
        log.debug("a task has run for over %gs: %d messages held behind it go back to the "
                  "broker for idle workers", self.handback_after, len(rest))

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        seconds = job.task.time_limit
        if (
            seconds is None
            or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()
        ):
            return late_limit(job, call)

        def on_alarm(signum: int, frame: FrameType | None) -> None:
            raise job.time_limit_error()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return late_limit(job, call)  # late too: in case the task swallowed the alarm
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
