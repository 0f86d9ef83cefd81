"""``threads``: a fixed pool of threads, for tasks that wait on I/O.

The worker fetches at most ``concurrency + prefetch`` deliveries ahead, so the local buffer stays
bounded and proportional to the pool. A finished thread takes the next buffered delivery at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ...brokers import Delivery
from .base import Executor, Process


class ThreadsExecutor(Executor):
    def __init__(self, concurrency: int, *, prefetch: int | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self.prefetch = concurrency if prefetch is None else prefetch
        self._buffer: deque[Delivery] = deque()
        self._running: dict[int, Delivery] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._process: Process | None = None

    def start(self, process: Process) -> None:
        self._process = process
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, name=f"hurtle-thread-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self) -> None:
        process = self._process
        assert process is not None
        me = threading.get_ident()
        cond = self._cond
        while True:
            with cond:
                while not self._buffer and not self._stopping:
                    cond.wait()
                if self._stopping and not self._buffer:
                    return
                if self._stopping:
                    return  # unstarted deliveries stay in the buffer, to be handed back
                delivery = self._buffer.popleft()
                self._running[me] = delivery
            try:
                process(delivery)
            finally:
                with cond:
                    self._running.pop(me, None)
                    cond.notify_all()

    def _free(self) -> int:
        return self.concurrency + self.prefetch - len(self._buffer) - len(self._running)

    def wait_for_capacity(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._stopping:
                free = self._free()
                if free > 0:
                    return free
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                self._cond.wait(left)
            return 0

    def submit(self, deliveries: list[Delivery]) -> None:
        with self._cond:
            self._buffer.extend(deliveries)
            self._cond.notify(len(deliveries))

    def idle(self) -> bool:
        with self._cond:
            return not self._buffer and not self._running

    def stop(self, timeout: float) -> list[Delivery]:
        with self._cond:
            self._stopping = True
            unstarted = list(self._buffer)
            self._buffer.clear()
            self._cond.notify_all()
            deadline = time.monotonic() + timeout
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        return unstarted

    def abort(self) -> list[Delivery]:
        with self._cond:
            self._stopping = True
            out = list(self._running.values()) + list(self._buffer)
            self._buffer.clear()
            self._running.clear()
            self._cond.notify_all()
        return out
