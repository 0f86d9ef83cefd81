"""``asyncio``: ``async def`` tasks on one event loop, up to ``concurrency`` in flight.

The worker's fetch loop stays on its own thread and hands each batch to the event loop, which runs
on a thread of its own; the loop decodes each delivery (``Processor.begin``) and then:

* awaits an ``async def`` task natively (``Processor.run_async``), cancelled at its time limit;
* runs a plain ``def`` task on a ``RunnerPool`` of threads that grows up to ``concurrency`` (and
  shrinks when idle), so that it can never block the loop; a time limit there works as in the
  threads pool (failed, thread abandoned and replaced).

Either way the outcome goes through the same ``Processor.finish``; should handling a delivery
fail unexpectedly, it is dead-lettered (``Processor.crashed``) and still counted as done, so the
worker never waits for it. At most ``concurrency`` run at once, and at most as many again wait in
the loop's buffer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ...brokers import Delivery
from ...context import bind
from ...errors import ConfigurationError
from ..processor import Job, Processor
from .base import Executor
from .runners import RunnerPool

log = logging.getLogger(__name__)
R = TypeVar("R")


class AsyncioExecutor(Executor):
    def __init__(self, concurrency: int, *, prefetch: int | None = None) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self.prefetch = concurrency if prefetch is None else prefetch
        # shared with the fetch thread, under _cond
        self._cond = threading.Condition()
        self._outstanding = 0  # submitted and not finished
        self._stopping = False
        self._incoming: list[list[Delivery]] = []  # submitted, not in the buffer yet
        # the loop's own state, touched only on the loop's thread
        self._buffer: deque[Delivery] = deque()
        self._running: dict[Job, asyncio.Task[None] | None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._processor: Processor | None = None
        self._threads: RunnerPool[Job] | None = None

    def running(self) -> int:
        # read from the heartbeat thread: the size of a dict the loop changes, a snapshot
        return len(self._running)

    def running_items(self) -> list[Any]:
        while True:  # the loop's dict, read from another thread: retried if it changed meanwhile
            try:
                return list(self._running)
            except RuntimeError:
                continue

    def cancel_running(self, items: list[Any]) -> None:
        """Cancel the asyncio tasks of these jobs (``async def`` tasks: an
        ``asyncio.CancelledError`` where they wait); plain ``def`` tasks on the pool's threads
        see ``hurtle.current().cancelled``."""
        if self._loop is None:
            return

        def cancel() -> None:
            for job in items:
                task = self._running.get(job)
                if task is not None:
                    task.cancel()

        self._loop.call_soon_threadsafe(cancel)

    # -- starting --------------------------------------------------------------------------

    def start(self, processor: Processor) -> None:
        self._processor = processor
        loop = self._loop = asyncio.new_event_loop()
        self._threads = RunnerPool(
            self._run_sync,
            max_size=self.concurrency,
            min_size=0,
            name="hurtle-asyncio-sync",
            on_expire=self._expired,
            tracker=processor.tracker,
        )
        self._thread = threading.Thread(target=loop.run_forever, name="hurtle-asyncio", daemon=True)
        self._thread.start()
        if processor.tracker is not None:  # ``hurtle.current()`` in an ``async def`` task
            loop.call_soon_threadsafe(bind, self._running_job, processor.tracker)

    def _running_job(self) -> Job | None:
        """The job of the asyncio task running now on the loop (``hurtle.current()``): looked
        up among the running ones when a task asks, so that no call pays for it."""
        task = asyncio.current_task()
        if task is None:
            return None
        for job, running in list(self._running.items()):
            if running is task:
                return job
        return None

    def _in_loop(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the loop's thread and return its result."""
        assert self._loop is not None
        future: Future[R] = Future()

        def call() -> None:
            try:
                future.set_result(fn())
            except BaseException as err:
                future.set_exception(err)

        self._loop.call_soon_threadsafe(call)
        return future.result()

    # -- the fetch thread's side -----------------------------------------------------------

    def wait_for_capacity(self, timeout: float) -> int:
        window = self.concurrency + self.prefetch
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or window > self._outstanding, timeout)
            return 0 if self._stopping else max(window - self._outstanding, 0)

    def submit(self, deliveries: list[Delivery]) -> None:
        assert self._loop is not None, "start() the executor first"
        with self._cond:
            self._outstanding += len(deliveries)
            self._incoming.append(deliveries)
        self._loop.call_soon_threadsafe(self._take, deliveries)

    def waiting(self) -> list[Delivery]:
        while True:
            with self._cond:
                incoming = [d for batch in self._incoming for d in batch]
                try:  # the loop's deque, read from any thread: retried if it moved meanwhile
                    return [*self._buffer, *incoming]
                except RuntimeError:
                    continue

    def idle(self) -> bool:
        with self._cond:
            return self._outstanding == 0

    # -- the loop's side -------------------------------------------------------------------

    def _take(self, deliveries: list[Delivery]) -> None:
        with self._cond:
            self._buffer.extend(deliveries)
            self._incoming = [b for b in self._incoming if b is not deliveries]
        self._fill()

    def _fill(self) -> None:
        processor = self._processor
        threads = self._threads
        assert processor is not None and threads is not None and self._loop is not None
        buffer, running = self._buffer, self._running
        while buffer and len(running) < self.concurrency and not self._stopping:
            delivery = buffer.popleft()
            if processor.screened_out(delivery):  # cancelled while it waited here
                self._settled(1)
                continue
            try:
                job = processor.begin(delivery)
            except Exception as err:
                processor.crashed(delivery, err)
                job = None
            if job is None:  # dead-lettered already
                self._settled(1)
            elif job.task.is_async:
                running[job] = self._loop.create_task(self._run_async(job))
            else:
                running[job] = None
                threads.submit((job,))

    async def _run_async(self, job: Job) -> None:
        assert self._processor is not None
        try:
            await self._processor.run_async(job)
        except Exception as err:
            self._processor.crashed(job.delivery, err)
        self._done(job)

    def _run_sync(self, job: Job) -> None:
        """On a pool thread: run a plain ``def`` task, then tell the loop."""
        assert self._processor is not None and self._loop is not None
        try:
            self._processor.run(job)
        except Exception as err:
            self._processor.crashed(job.delivery, err)
        self._loop.call_soon_threadsafe(self._done, job)

    def _expired(self, job: Job) -> None:
        """On the pool's watchdog: a plain ``def`` task overran and was abandoned."""
        assert self._processor is not None and self._loop is not None
        self._processor.expire(job)
        self._loop.call_soon_threadsafe(self._done, job)

    def _done(self, job: Job) -> None:
        if job in self._running:  # not given up by abort() meanwhile
            del self._running[job]
            self._settled(1)
            self._fill()

    def _settled(self, n: int) -> None:
        with self._cond:
            self._outstanding -= n
            self._cond.notify_all()

    # -- stopping --------------------------------------------------------------------------

    def stop(self) -> list[Delivery]:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._loop is None:
            return []

        def take_unstarted() -> list[Delivery]:
            out = list(self._buffer)
            self._buffer.clear()
            self._settled(len(out))
            return out

        return self._in_loop(take_unstarted)

    def join(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding <= 0, timeout)

    def abort(self) -> list[Delivery]:
        self.stop()
        if self._loop is None:
            return []

        def give_up() -> list[Delivery]:
            assert self._threads is not None
            self._threads.abort()
            out = [job.delivery for job in self._running]
            for task in self._running.values():
                if task is not None:
                    task.cancel()
            self._running.clear()
            self._settled(len(out))
            return out

        return self._in_loop(give_up)

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._threads is not None:
            self._threads.stop()

        async def wind_down() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_asyncgens()

        try:
            asyncio.run_coroutine_threadsafe(wind_down(), loop).result(5)
        except Exception as err:
            log.warning("the asyncio pool's loop did not wind down cleanly: %s", err)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        assert self._threads is not None
        return self._threads.limit(job, call)

    def abandoned(self) -> int:
        return self._threads.abandoned() if self._threads is not None else 0
