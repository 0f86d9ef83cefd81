"""``Processor``: runs one delivery — decode, find the task, call it — and decides its outcome.

Outcomes go to the acker: done (ack), another attempt (retry with backoff), or a dead letter with
the reason (undecodable bytes, unknown task, retries exhausted, time limit, ``Reject``, arguments
the task cannot be called with). Nothing here talks to the broker directly, and nothing a task
raises escapes, except ``BaseException``s used to stop the worker.

Every delivery ends in an outcome. Whatever goes wrong while handling one (an exception whose
``str`` raises, bytes that make the decoder fail in an unexpected way, an error while recording
the outcome) dead-letters that delivery with the reason (``crashed``) instead of killing the
worker or leaving the message in flight: one bad message never stops a fleet. Objects that come
from user code (exceptions, arguments) are formatted with ``describe``/``safe_repr``, which never
raise. A call that raises ``TypeError`` because its arguments do not fit the task's signature is
never retried: no attempt could succeed (checked only when a ``TypeError`` is raised).

A delivery goes through three steps, which executors may drive separately:

* ``begin`` decodes and looks up the task (a ``Job``), or dead-letters what cannot run;
* the call: ``run`` (synchronous, an ``async def`` task on this thread's own loop) or
  ``run_async`` (awaited on the asyncio executor's loop);
* ``finish``: middleware ``after_process`` hooks, then the outcome.

``process`` is the short path that solo, threads and greenlet pools use for tasks without
middleware or a time limit. Time limits are the executor's business (``Limit``): only it knows
how a running call can be stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ..brokers import Delivery
from ..errors import DecodeError, Reject, Retry, TimeLimitExceeded
from ..message import Message, decode_unchecked
from ..middleware import Middleware, Outcome
from ..middleware.retries import backoff, next_attempt
from .acker import Acker

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..task import Task

log = logging.getLogger(__name__)
_decode = Message.decode
#: Seconds the jobs of a batch wait in their queue when a ``before_batch`` hook failed.
BEFORE_BATCH_PAUSE = 1.0


class BatchState(Protocol):
    """What ``process_many`` reads and keeps up to date for the executor driving it."""

    #: Set (from a signal handler or another thread) to start nothing more.
    stopping: bool
    #: The delivery whose task runs now, so that a hard stop can hand it back. It is cleared as
    #: soon as the call returns, before the outcome is recorded: a hard stop never hands back a
    #: delivery that has an outcome.
    current: Delivery | None
    #: Where the deliveries left unstarted by a stop go.
    unstarted: list[Delivery]
    #: The batch's deliveries not taken yet. ``process_many`` takes them from the left; another
    #: thread may take some from the right (to hand them back): each is taken exactly once.
    pending: deque[Delivery]


class Job:
    """One decoded delivery and the task it names, on its way through the processor."""

    __slots__ = ("defer_reason", "deferred", "delivery", "message", "started", "task")

    def __init__(self, delivery: Delivery, message: Message, task: Task[Any, Any]) -> None:
        self.delivery = delivery
        self.message = message
        self.task = task
        self.started = 0.0
        #: Seconds from now after which a deferred job goes back to its queue, else None.
        self.deferred: float | None = None
        self.defer_reason = ""

    def defer(self, delay: float, reason: str) -> None:
        """Put this job back in its queue after ``delay`` seconds, unrun, same attempt."""
        self.deferred = max(delay, 0.0)
        self.defer_reason = reason

    def call(self) -> Any:
        """Call the task function (a coroutine function returns its coroutine)."""
        m = self.message
        return self.task.fn(*m.args, **m.kwargs)

    def time_limit_error(self) -> TimeLimitExceeded:
        limit = self.task.time_limit
        return TimeLimitExceeded(
            f"task {self.task.name}[{self.message.id}] ran longer than its time limit of "
            f"{limit:g}s and was stopped"
        )

    def overran(self) -> bool:
        limit = self.task.time_limit
        return limit is not None and time.monotonic() - self.started > limit


#: How an executor runs a time-limited call: ``limit(job, call)`` returns what ``call`` returns,
#: or raises ``TimeLimitExceeded`` (or stops the call some other way and says so).
Limit = Callable[[Job, Callable[[], Any]], Any]


def late_limit(job: Job, call: Callable[[], Any]) -> Any:
    """The fallback when a call cannot be interrupted: let it end, then fail it if it overran."""
    result = call()
    if job.overran():
        raise job.time_limit_error()
    return result


class Processor:
    def __init__(
        self,
        app: Hurtle,
        acker: Acker,
        middleware: Sequence[Middleware] = (),
        *,
        limit: Limit = late_limit,
        loops_take_turns: bool = False,
    ) -> None:
        self.app = app
        self.tasks = app.tasks
        self.acker = acker
        self.middleware = list(middleware)
        self._hooks: dict[str, list[Middleware]] = {}  # task name -> middleware applying to it
        self._per_job: dict[str, bool] = {}  # task name -> whether a hook runs around each job
        self._inline: set[str] = set()  # names of tasks whose middleware has no per-job hook
        # id of a delivery -> (it, its message) decoded by before_batch for process_many
        self._decoded: dict[int, tuple[Delivery, Message]] = {}
        self._batch: list[tuple[Middleware, list[Job]]] = []  # solo: the batch's hooked jobs
        self.limit = limit
        self.max_retry_delay = app.settings.max_retry_delay
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        # Greenlets share one OS thread, and asyncio allows one running loop per OS thread: in
        # greenlet pools, ``async def`` tasks take turns.
        self._turns: AbstractContextManager[Any] = (
            threading.Lock() if loops_take_turns else contextlib.nullcontext()
        )
        #: Deliveries taken in hand (whatever the outcome), for progress reports.
        self.processed = 0
        self.failed = 0

    # -- the short path --------------------------------------------------------------------

    def process(self, delivery: Delivery) -> None:
        """Run one delivery to its outcome (hot path: keep it short; no ``Job`` unless needed)."""
        self.processed += 1
        try:
            message = _decode(delivery.raw)
        except Exception as err:  # DecodeError, or whatever the decoder let escape
            self._undecodable(delivery, err)
            return
        task = self.tasks.get(message.task)
        if task is None:
            self._unknown(delivery, message)
            return
        if (self.middleware and self.per_job(task)) or task.is_async or task.time_limit is not None:
            self.run(Job(delivery, message, task))
            return
        try:
            task.fn(*message.args, **message.kwargs)
        except Exception as err:
            self._failed(Job(delivery, message, task), err)
            return
        self.acker.ack(delivery)

    def process_many(self, deliveries: list[Delivery], state: BatchState) -> None:
        """Run a batch one delivery after another on this thread (the solo pool's hot path).

        Plain tasks are called inline and acknowledged together once the batch is done; anything
        else (bad bytes, unknown tasks, ``async def``, time limits, middleware) takes ``process``.
        """
        tasks = self.tasks
        decode = decode_unchecked
        plain = not self.middleware
        inline = self._inline
        decoded, self._decoded = self._decoded, {}  # by before_batch, not to decode twice
        done: list[Delivery] = []
        started = 0
        pending = state.pending = deque(deliveries)
        take = pending.popleft
        try:
            while True:
                try:
                    delivery = take()
                except IndexError:  # all taken (some perhaps handed back by another thread)
                    break
                state.current = delivery
                if state.stopping:
                    state.current = None
                    state.unstarted.append(delivery)
                    state.unstarted.extend(_take_all(pending))
                    break
                try:
                    entry = decoded.pop(id(delivery), None) if decoded else None
                    if entry is not None and entry[0] is delivery:
                        message = entry[1]
                    else:
                        message = decode(delivery.raw)
                    task = tasks[message.task]
                except Exception:
                    state.current = None
                    self.process(delivery)  # dead-letters it with the reason
                    continue
                started += 1
                if (
                    (not plain and message.task not in inline and self.per_job(task))
                    or task.is_async or task.time_limit is not None
                ):
                    self.run(Job(delivery, message, task), state)
                    continue
                try:
                    task.fn(*message.args, **message.kwargs)
                except Exception as err:
                    state.current = None
                    self._failed(Job(delivery, message, task), err)
                    continue
                state.current = None  # before the outcome: a hard stop now hands nothing back
                done.append(delivery)
        except BaseException:  # a hard stop raised in a task: the rest goes back unstarted
            state.unstarted.extend(_take_all(pending))
            raise
        finally:  # also when a hard stop raises in a task: what finished is acknowledged
            self.processed += started
            if done:
                self.acker.ack_many(done)
            if self._batch:
                self._after_batch()

    # -- middleware --------------------------------------------------------------------------

    def hooks(self, task: Task[Any, Any]) -> list[Middleware]:
        """The middleware that apply to ``task``, decided once per task."""
        hooks = self._hooks.get(task.name)
        if hooks is None:
            hooks = self._hooks[task.name] = [m for m in self.middleware if m.applies_to(task)]
        return hooks

    def per_job(self, task: Task[Any, Any]) -> bool:
        """Whether a middleware applying to ``task`` has hooks around each job (else the task
        runs inline, as if there were no middleware)."""
        per_job = self._per_job.get(task.name)
        if per_job is None:
            per_job = self._per_job[task.name] = any(
                getattr(type(m), hook) is not getattr(Middleware, hook)
                for m in self.hooks(task)
                for hook in ("before_process", "after_process", "after_outcome")
            )
            if not per_job:
                self._inline.add(task.name)
        return per_job

    def before_batch(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Run the ``before_batch`` hooks over a fetched batch; defer the jobs they mark and
        return the deliveries left to run (those that cannot be decoded stay, for ``process``
        to dead-letter)."""
        by_task: dict[str, list[Job] | None] = {}  # None: no middleware applies to the task
        tasks = self.tasks
        decoded = self._decoded = {}
        for delivery in deliveries:
            try:
                message = decode_unchecked(delivery.raw)
                task = tasks[message.task]
            except Exception:
                continue
            decoded[id(delivery)] = (delivery, message)
            if message.task not in by_task:
                by_task[message.task] = [] if self.hooks(task) else None
            jobs = by_task[message.task]
            if jobs is not None:
                jobs.append(Job(delivery, message, task))
        per_hook: dict[int, tuple[Middleware, list[Job]]] = {}
        for jobs in by_task.values():
            if jobs:
                for m in self.hooks(jobs[0].task):
                    entry = per_hook.get(id(m))
                    if entry is None:
                        per_hook[id(m)] = (m, list(jobs))
                    else:
                        entry[1].extend(jobs)
        if not per_hook:
            return deliveries
        deferred: set[int] = set()
        for m, jobs in per_hook.values():
            try:
                m.before_batch(jobs)
            except Exception as err:  # (the broker is unreachable...) run none of them now
                log.error("middleware %s failed in before_batch: %s; its %d jobs go back to "
                          "their queue for %gs", safe_repr(m), describe(err), len(jobs),
                          BEFORE_BATCH_PAUSE)
                for job in jobs:
                    if job.deferred is None:
                        job.defer(BEFORE_BATCH_PAUSE, "before_batch failed")
            now = time.time()
            for job in jobs:
                if job.deferred is not None and id(job.delivery) not in deferred:
                    deferred.add(id(job.delivery))
                    self.acker.defer(job.delivery, now + job.deferred)
                    for other in self.hooks(job.task):
                        other.after_outcome(job, Outcome("deferred"))
        self._batch = [
            (m, [j for j in jobs if id(j.delivery) not in deferred] if deferred else jobs)
            for m, jobs in per_hook.values()
            if type(m).after_batch is not Middleware.after_batch
        ]
        if not deferred:
            return deliveries
        return [d for d in deliveries if id(d) not in deferred]

    def _after_batch(self) -> None:
        """The ``after_batch`` hooks of the batch ``process_many`` ran (solo)."""
        batch, self._batch = self._batch, []
        for m, jobs in batch:
            try:
                m.after_batch(jobs)
            except Exception as err:
                log.error("middleware %s failed in after_batch: %s", safe_repr(m), describe(err))

    # -- the steps -------------------------------------------------------------------------

    def begin(self, delivery: Delivery) -> Job | None:
        """Decode and find the task; dead-letter (and return None) what cannot run."""
        self.processed += 1
        try:
            message = _decode(delivery.raw)
        except Exception as err:  # DecodeError, or whatever the decoder let escape
            self._undecodable(delivery, err)
            return None
        task = self.tasks.get(message.task)
        if task is None:
            self._unknown(delivery, message)
            return None
        return Job(delivery, message, task)

    def run(self, job: Job, state: BatchState | None = None) -> None:
        """Call the task on this thread (within its time limit), then settle the outcome.

        With ``state`` (the solo pool), ``state.current`` is cleared once the call returned.
        """
        result: Any = None
        error: Exception | None = None
        try:
            self._start(job)
            if job.task.is_async:
                result = self._run_coroutine(job)
            elif job.task.time_limit is None:
                result = job.call()
            else:
                result = self.limit(job, job.call)
        except Exception as err:
            error = err
        if state is not None:
            state.current = None
        self.finish(job, result, error)

    async def run_async(self, job: Job) -> None:
        """Await an ``async def`` task on the running loop (cancelled at its time limit)."""
        result: Any = None
        error: Exception | None = None
        try:
            self._start(job)
            result = await _within_limit(job)
        except Exception as err:
            error = err
        self.finish(job, result, error)

    def _start(self, job: Job) -> None:
        """The ``before_process`` hooks (they may raise ``Retry``/``Reject``), then the clock."""
        for m in self.hooks(job.task):
            m.before_process(job)
        job.started = time.monotonic()

    def finish(self, job: Job, result: Any, error: Exception | None) -> None:
        """Run the ``after_process`` hooks and record the outcome with the acker."""
        hooks = self.hooks(job.task)
        for m in reversed(hooks):
            try:
                m.after_process(job, result, error)
            except Exception as err:
                log.error("middleware %s failed in after_process: %s", safe_repr(m),
                          describe(err))
        if error is None:
            self.acker.ack(job.delivery)
            kind = "ack"
        else:
            kind = self._failed(job, error)
        if hooks:
            outcome = Outcome(kind, result, error)
            for m in reversed(hooks):
                try:
                    m.after_outcome(job, outcome)
                except Exception as err:
                    log.error("middleware %s failed in after_outcome: %s", safe_repr(m),
                              describe(err))

    def crashed(self, delivery: Delivery, err: BaseException) -> None:
        """Dead-letter a delivery whose handling failed unexpectedly (the last resort)."""
        self.failed += 1
        self._crashed(delivery, err)

    def _crashed(self, delivery: Delivery, err: BaseException) -> None:
        reason = (
            f"the worker could not handle this message ({describe(err)}); it is kept here "
            f"instead of being retried, since it would fail the same way:\n{_trace(err)}"
        )
        log.error("dead-lettering a message of %r that could not be handled: %s",
                  delivery.queue, describe(err))
        self.acker.dead_letter(delivery, reason)

    def expire(self, job: Job) -> None:
        """Fail a job whose call could not be stopped at its time limit (it was abandoned)."""
        self.finish(job, None, job.time_limit_error())

    # -- helpers ---------------------------------------------------------------------------

    def _undecodable(self, delivery: Delivery, err: Exception) -> None:
        self.failed += 1
        text = str(err) if isinstance(err, DecodeError) else describe(err)
        log.error("dead-lettering an undecodable message from %r: %s", delivery.queue, text)
        self.acker.dead_letter(delivery, f"undecodable message: {text}")

    def _unknown(self, delivery: Delivery, message: Message) -> None:
        self.failed += 1
        reason = (
            f"unknown task {message.task!r}: this worker's app registers no task of that "
            "name; deploy the code that defines it, then retry the dead letter"
        )
        log.error("dead-lettering message %s: %s", message.id, reason)
        self.acker.dead_letter(delivery, reason)

    def _run_coroutine(self, job: Job) -> Any:
        """Run an ``async def`` task outside the asyncio pool, on this thread's own loop."""
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            self._loops.append(loop)
        with self._turns:
            return loop.run_until_complete(_within_limit(job))

    def _failed(self, job: Job, err: Exception) -> str:
        """Retry or dead-letter a failed job; returns which ("retry" or "dead")."""
        self.failed += 1
        try:
            return self._decide(job, err)
        except Exception as inner:  # formatting or deciding failed: still an outcome
            self._crashed(job.delivery, inner)
            return "dead"

    def _decide(self, job: Job, err: Exception) -> str:
        delivery, message, task = job.delivery, job.message, job.task
        if isinstance(err, TypeError) and (unfit := task.unfit(message.args, message.kwargs)):
            reason = (
                f"task {task.name} cannot be called with the arguments of this message "
                f"({unfit}); retrying cannot help: send it with arguments that match "
                f"{task.name}{_signature(task.fn)}, then purge this dead letter"
            )
            log.error("task %s[%s]: %s", task.name, message.id, reason)
            self.acker.dead_letter(delivery, reason)
            return "dead"
        if isinstance(err, Reject):
            reason = safe_str(err.reason)
            log.warning("task %s[%s] rejected: %s", task.name, message.id, reason)
            self.acker.dead_letter(delivery, f"rejected by task {task.name}: {reason}")
            return "dead"
        summary = describe(err)
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
            return "retry"
        reason = (
            f"task {task.name} failed on attempt {message.attempt + 1} of {task.retries + 1}; "
            f"no retries left:\n{_trace(err)}"
        )
        log.error("task %s[%s] failed for good: %s", task.name, message.id, summary)
        self.acker.dead_letter(delivery, reason)
        return "dead"

    def close(self) -> None:
        for loop in self._loops:
            if not loop.is_running():
                loop.close()
        self._loops.clear()


def safe_str(value: object) -> str:
    """``str(value)``, or a placeholder when that raises (user objects may do anything)."""
    try:
        text = str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if isinstance(text, str) else f"<unprintable {type(value).__name__}>"


def safe_repr(value: object) -> str:
    """``repr(value)``, or a placeholder when that raises."""
    try:
        return repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def describe(err: BaseException) -> str:
    """``TypeName: message`` for an exception, even one whose ``__str__`` raises."""
    return f"{type(err).__name__}: {safe_str(err)}"


def _trace(err: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(err))
    except Exception:
        return describe(err)


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _take_all(pending: deque[Delivery]) -> Iterator[Delivery]:
    """Take what is left of a batch, one at a time (another thread may take from the right)."""
    take = pending.popleft
    while True:
        try:
            yield take()
        except IndexError:
            return


async def _within_limit(job: Job) -> Any:
    coroutine: Coroutine[Any, Any, Any] = job.call()
    limit = job.task.time_limit
    if limit is None:
        return await coroutine
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await coroutine
    except TimeoutError:
        if deadline.expired():
            raise job.time_limit_error() from None
        raise  # the task's own TimeoutError, not the limit
