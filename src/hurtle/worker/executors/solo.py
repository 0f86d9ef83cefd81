"""``solo``: runs deliveries one after another on the worker's own thread.

The fastest mode for short tasks: no hand-off between threads, one fetch per batch. The batch size
adapts to how long tasks take, so that a batch holds about ``target_batch_seconds`` of work: short
tasks are fetched a thousand at a time, slow ones one at a time, and a slow task never keeps a
backlog of others from workers that are idle.

Time limits: when the worker runs on the main thread (``hurtle worker``), a ``SIGALRM`` timer
raises ``TimeLimitExceeded`` in the task where it is, even in ``time.sleep`` or a socket wait. On
any other thread (a worker started with ``run_in_thread``) signals cannot reach it: the task runs
to its end and is failed then if it overran.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from time import perf_counter
from types import FrameType
from typing import Any

from ...brokers import Delivery
from ..processor import Job, Processor, late_limit
from .base import Executor


class SoloExecutor(Executor):
    concurrency = 1
    runs_in_submit = True

    def __init__(self, *, max_batch: int = 1000, target_batch_seconds: float = 0.05) -> None:
        self.max_batch = max_batch
        self.target = target_batch_seconds
        self._per_task = target_batch_seconds / 8  # a guess until the first batch is timed
        self._processor: Processor | None = None
        self.stopping = False
        self.current: Delivery | None = None
        self.unstarted: list[Delivery] = []

    def start(self, processor: Processor) -> None:
        self._processor = processor

    def wait_for_capacity(self, timeout: float) -> int:
        if self.stopping:
            return 0
        return max(1, min(self.max_batch, int(self.target / max(self._per_task, 1e-7))))

    def submit(self, deliveries: list[Delivery]) -> None:
        processor = self._processor
        assert processor is not None, "start() the executor first"
        started = perf_counter()
        before = len(self.unstarted)
        processor.process_many(deliveries, self)
        done = len(deliveries) - (len(self.unstarted) - before)
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
