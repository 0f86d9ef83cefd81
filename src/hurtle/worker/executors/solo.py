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

    def __init__(self, *, max_batch: int = 1000, target_batch_seconds: float = 0.05) -> None:
        self.max_batch = max_batch
        self.target = target_batch_seconds
        self._per_task = target_batch_seconds / 8  # a guess until the first batch is timed
        self._process: Callable[[Delivery], None] | None = None
        self._stopping = False
        self._current: Delivery | None = None
        self._unstarted: list[Delivery] = []

    def start(self, processor: Processor) -> None:
        self._process = processor.process

    def wait_for_capacity(self, timeout: float) -> int:
        if self._stopping:
            return 0
        return max(1, min(self.max_batch, int(self.target / max(self._per_task, 1e-7))))

    def submit(self, deliveries: list[Delivery]) -> None:
        process = self._process
        assert process is not None, "start() the executor first"
        started = perf_counter()
        done = 0
        for i, delivery in enumerate(deliveries):
            if self._stopping:
                self._unstarted.extend(deliveries[i:])
                break
            self._current = delivery
            process(delivery)
            done += 1
        self._current = None
        if done:
            per_task = (perf_counter() - started) / done
            self._per_task = 0.5 * self._per_task + 0.5 * per_task

    def idle(self) -> bool:
        return self._current is None

    def request_stop(self) -> None:
        self._stopping = True  # submit() checks it between deliveries

    def stop(self) -> list[Delivery]:
        self._stopping = True
        unstarted, self._unstarted = self._unstarted, []
        return unstarted

    def join(self, timeout: float) -> bool:
        return True  # tasks run inside submit(): none runs once the fetch loop is out

    def abort(self) -> list[Delivery]:
        self._stopping = True
        out, self._unstarted = self._unstarted, []
        if self._current is not None:
            out.insert(0, self._current)
            self._current = None
        return out

    def interrupts_caller(self) -> bool:
        return self._current is not None

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
