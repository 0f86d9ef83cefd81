"""``Processor``: runs one delivery — decode, find the task, call it — and decides its outcome.

Outcomes go to the acker: done (ack), another attempt (retry with backoff), or a dead letter with
the reason (undecodable bytes, unknown task, retries exhausted, ``Reject``). Nothing here talks
to the broker directly, and nothing a task raises escapes, except ``BaseException``s used to stop
the worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from ..brokers import Delivery
from ..errors import DecodeError, Reject, Retry
from ..message import Message
from ..middleware import Middleware
from ..middleware.retries import backoff, next_attempt
from .acker import Acker

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..task import Task

log = logging.getLogger(__name__)
_decode = Message.decode


class Processor:
    def __init__(self, app: Hurtle, acker: Acker, middleware: Sequence[Middleware] = ()) -> None:
        self.app = app
        self.tasks = app.tasks
        self.acker = acker
        self.middleware = list(middleware)
        self.max_retry_delay = app.settings.max_retry_delay
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        #: Deliveries whose task ran (whatever the outcome), for progress reports.
        self.processed = 0
        self.failed = 0

    def process(self, delivery: Delivery) -> None:
        """Run one delivery to its outcome (hot path: keep it short)."""
        self.processed += 1
        try:
            message = _decode(delivery.raw)
        except DecodeError as err:
            self.failed += 1
            log.error("dead-lettering an undecodable message from %r: %s", delivery.queue, err)
            self.acker.dead_letter(delivery, f"undecodable message: {err}")
            return
        task = self.tasks.get(message.task)
        if task is None:
            self.failed += 1
            reason = (
                f"unknown task {message.task!r}: this worker's app registers no task of that "
                "name; deploy the code that defines it, then retry the dead letter"
            )
            log.error("dead-lettering message %s: %s", message.id, reason)
            self.acker.dead_letter(delivery, reason)
            return
        if self.middleware:
            self._process_with_middleware(delivery, message, task)
            return
        try:
            result = task.fn(*message.args, **message.kwargs)
            if task.is_async:
                self._run_coroutine(result)
        except Exception as err:
            self._failed(delivery, message, task, err)
            return
        self.acker.ack(delivery)

    def _process_with_middleware(
        self, delivery: Delivery, message: Message, task: Task[Any, Any]
    ) -> None:
        result: Any = None
        error: Exception | None = None
        try:
            for m in self.middleware:
                m.before_process(message)
            result = task.fn(*message.args, **message.kwargs)
            if task.is_async:
                result = self._run_coroutine(result)
        except Exception as err:
            error = err
        for m in reversed(self.middleware):
            try:
                m.after_process(message, result, error)
            except Exception:
                log.exception("middleware %r failed in after_process", m)
        if error is None:
            self.acker.ack(delivery)
        else:
            self._failed(delivery, message, task, error)

    def _run_coroutine(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run an ``async def`` task outside the asyncio pool, on this thread's own loop."""
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            self._loops.append(loop)
        return loop.run_until_complete(coroutine)

    def _failed(
        self, delivery: Delivery, message: Message, task: Task[Any, Any], err: Exception
    ) -> None:
        self.failed += 1
        if isinstance(err, Reject):
            log.warning("task %s[%s] rejected: %s", task.name, message.id, err.reason)
            self.acker.dead_letter(delivery, f"rejected by task {task.name}: {err.reason}")
            return
        summary = f"{type(err).__name__}: {err}"
        if message.attempt < task.retries:
            if isinstance(err, Retry) and err.delay is not None:
                delay = err.delay
            else:
                delay = backoff(message.attempt, task.retry_delay, self.max_retry_delay)
            log.warning(
                "task %s[%s] attempt %d of %d failed (%s); retrying in %.2fs",
                task.name, message.id, message.attempt + 1, task.retries + 1, summary, delay,
            )
            self.acker.retry(delivery, next_attempt(message, delay, summary))
            return
        trace = "".join(traceback.format_exception(err))
        reason = (
            f"task {task.name} failed on attempt {message.attempt + 1} of {task.retries + 1}; "
            f"no retries left:\n{trace}"
        )
        log.error("task %s[%s] failed for good: %s", task.name, message.id, summary)
        self.acker.dead_letter(delivery, reason)

    def close(self) -> None:
        for loop in self._loops:
            if not loop.is_running():
                loop.close()
        self._loops.clear()
