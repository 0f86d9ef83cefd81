"""The steps of one job, a mixin of ``Processor``: the path of a delivery whose task is not
called inline (per-call hooks, a time limit, ``async def``), and of every failure.

A delivery of a non-inline task goes through three steps, which executors may drive separately:

* ``begin`` decodes and looks up the task (a ``Job``), or dead-letters what cannot run;
* the call: ``run`` (synchronous, an ``async def`` task on this thread's own loop) or
  ``run_async`` (awaited on the asyncio executor's loop), after the ``before_process`` hooks;
* ``finish``: ``after_process`` hooks (one that raises a ``HurtleError`` after a call that
  returned fails the call with it — a result that cannot be stored fails the task; any other
  exception from a hook is logged and changes nothing), the outcome, and the
  ``after_outcome`` hooks: after an acknowledgement is handed to the acker, but just *before* a
  retry or dead letter is, so that what they hand the acker (a failure record) is flushed no
  later than the outcome — else a quick next attempt elsewhere could store its success first
  and the stale failure replace it.

A failed call is the built-in ``Retries`` middleware's decision (``_failed``): another attempt,
or a dead letter, which ends its result record, its workflow and its unique lock first
(``NotRun._bury``, ``ends``). Kept apart from the inline loop (``processor``) and the batch path
(``batch``); the methods read the state of the ``Processor`` they are mixed into."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .._text import describe, safe_repr
from ..adaptive import retry_delay
from ..brokers import Delivery
from ..errors import HurtleError, TaskCancelled, Throttle
from ..flow import FLOW
from ..message import Message
from ..middleware import Calls, Job, Middleware, Outcome, Pipeline
from ..records import CANCELLED
from . import flows
from .jobs import BatchState, Limit
from .loops import Loops
from .unrun import DEAD_LETTERED, FAILED, PROCESSED, RETRIED, NotRun

if TYPE_CHECKING:
    from ..brokers.reports import Timings
    from ..middleware.limits import RateLimitMiddleware
    from ..middleware.retries import Retries
    from .log import CallLog

log = logging.getLogger("hurtle.worker.processor")  # the name these lines were always logged under
_decode = Message.decode


class JobSteps(NotRun):
    if TYPE_CHECKING:  # what the steps use of the ``Processor`` they are mixed into
        call_log: CallLog
        log_calls: bool
        retries: Retries
        throttles: list[RateLimitMiddleware]
        limit: Limit
        cancels: set[str]
        timings: Timings
        _loops: Loops

        def pipeline(self, name: str) -> Pipeline | None: ...
        def _settle_calls(self, calls: Calls, job: Job | None = None) -> None: ...
        def _before_batch(self, groups: dict[Middleware, list[Job]]) -> None: ...
        def _after_batch(self, groups: dict[Middleware, list[Job]]) -> None: ...

    def _job(self, delivery: Delivery, message: Message, count: bool = True) -> Job | None:
        """A job for a decoded message, with its task's pipeline; dead-letters an unknown task
        (and returns None). Counted in the tally (unless ``count`` is False) now, or, when its
        middleware may still defer it (``_alone``), once it is sure to run."""
        pipeline = self.pipeline(message.task)
        if pipeline is None:
            self._unknown(delivery, message)
            return None
        if count and not pipeline.batched:
            self.tally.add(delivery.queue, message.task, PROCESSED)
        return Job(delivery, message, pipeline.task, pipeline)

    def begin(self, delivery: Delivery, count: bool = True) -> Job | None:
        """Decode and find the task; dead-letter (and return None) what cannot run. ``count``
        False: the delivery was counted already (a call that overran its time limit)."""
        self.processed += count
        try:
            message = _decode(delivery.raw)
        except Exception as err:  # DecodeError, or whatever the decoder let escape
            self._undecodable(delivery, err)
            return None
        if message.expires and message.expires <= time.time():
            self.processed -= 1  # counted above
            self._too_late(delivery, message)
            return None
        return self._job(delivery, message, count)

    def run(self, job: Job, state: BatchState | None = None) -> None:
        """Call the task on this thread (within its time limit), then settle the outcome.

        With ``state`` (the solo pool), ``state.current`` is cleared once the call returned. A
        job outside a batch whose pipeline has batch hooks is a batch of one.
        """
        if not self._begin(job, state):
            return
        result: Any = None
        error: Exception | None = None
        try:
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
        if not self._begin(job):
            return
        result: Any = None
        error: Exception | None = None
        try:
            result = await _within_limit(job)
        except asyncio.CancelledError:
            if job.message.id not in self.cancels:
                raise  # the pool is stopping: not ours to record
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # ``Hurtle.cancel``'s (``cancel_running``): recorded below
            error = cancelled_error(job)
        except Exception as err:
            error = err
        self.finish(job, result, error)

    def _begin(self, job: Job, state: BatchState | None = None) -> bool:
        """Whether to call ``job``'s task now, for ``run`` and ``run_async``: not if it was
        deferred (``_alone``), nor if its ``before_process`` hooks raised (``Retry``,
        ``Reject``, a failure): that is its outcome, settled here as the call's would be."""
        if self._alone(job):
            return False
        try:
            self._start(job)
        except Exception as err:
            if state is not None:
                state.current = None
            self.finish(job, None, err)
            return False
        return True

    def _alone(self, job: Job) -> bool:
        """Run ``before_batch`` for a batched job met on its own; True when it was deferred."""
        pipeline = job.pipeline
        if pipeline is None or not pipeline.batched or job.batch:
            return False
        job.alone = True  # its batch is itself: ``finish`` runs ``after_batch``
        self._before_batch({m: [job] for m in pipeline.before_batch})
        if job.deferred:  # not run now: not counted (it comes back to run later)
            self.processed -= 1
            self._defer(job)
            self._after_batch({m: [job] for m in pipeline.after_batch})
            return True
        if job.superseded:  # a later call of its debounce key replaced it: settled, not run
            self.processed -= 1  # counted there
            self.superseded([job])
            return True
        self.tally.add(job.delivery.queue, job.task.name, PROCESSED)
        return False

    def _start(self, job: Job) -> None:
        """The ``before_process`` hooks (they may raise ``Retry``/``Reject``), then the clock."""
        if job.message.headers and FLOW in job.message.headers:
            flows.prepare(job, self.app)
        if job.pipeline is not None:
            for hook in job.pipeline.before_process:
                hook(job)
        job.started = time.monotonic()

    def finish(self, job: Job, result: Any, error: Exception | None) -> None:
        """Run the ``after_process`` hooks and record the outcome with the acker."""
        if self.cancels and job.message.id in self.cancels and error is None:
            error = cancelled_error(job)  # cancelled while it ran: whatever it returned
        if job.started:
            job.finished = time.monotonic()
            self.timings.add(job.delivery.queue, job.task.name, job.finished - job.started)
        pipeline = job.pipeline
        if pipeline is not None:
            for hook in pipeline.after_process:
                try:
                    hook(job, result, error)
                except Exception as err:
                    if error is None and isinstance(err, HurtleError):
                        error = err  # a refusal (a result that cannot be stored): it failed
                        continue
                    log.error(
                        "middleware %s failed in after_process: %s",
                        safe_repr(getattr(hook, "__self__", hook)),
                        describe(err),
                    )
            if error is None and pipeline.after_calls and job.flow is None:
                calls = Calls(job.task)
                calls.deliveries.append(job.delivery)
                calls.messages.append(job.message)
                calls.results.append(result)
                calls.runtimes.append(job.finished - job.started if job.started else 0.0)
                self._settle_calls(calls, job)  # acknowledged, or failed
                if self.log_calls and not calls.failures:
                    self.call_log.job(job, result)
                if job.alone and pipeline.after_batch:
                    self._after_batch({m: [job] for m in pipeline.after_batch})
                return
        stepped = False
        if error is None and job.flow is not None:
            try:  # its acknowledgement carries what it sets off
                self.acker.ack_flow(flows.step(job, result, self.app))
                stepped = True
            except Exception as err:  # a result that cannot be encoded: the call failed
                error = err
        if error is None:
            if stepped:
                pass  # acknowledged with its workflow step
            elif (stored := job.stored) is None:
                self.acker.ack(job.delivery)
            else:
                self.acker.ack_many_with_results([job.delivery], [stored])
            job.outcome = Outcome("ack", result)
            self._after_outcome(job)
            if self.log_calls:
                self.call_log.job(job, result)
        else:
            self._failed(job, error)
        if job.alone and pipeline is not None and pipeline.after_batch:
            self._after_batch({m: [job] for m in pipeline.after_batch})

    def _defer(self, job: Job) -> None:
        """Put a deferred job back in its queue, unchanged, due after its delay."""
        log.debug(
            "task %s[%s] deferred for %.3gs: %s",
            job.task.name,
            job.message.id,
            job.defer_delay,
            job.defer_reason,
        )
        self.acker.defer(job.delivery, time.time() + job.defer_delay)
        job.outcome = Outcome("deferred")
        self._after_outcome(job)

    def _after_outcome(self, job: Job) -> None:
        pipeline, outcome = job.pipeline, job.outcome
        if pipeline is None or outcome is None:
            return
        # middleware with ``after_calls`` saw the acknowledgement there
        hooks = pipeline.ack_outcome if outcome.kind == "ack" else pipeline.after_outcome
        for hook in hooks:
            try:
                hook(job, outcome)
            except Exception as err:
                log.error(
                    "middleware %s failed in after_outcome: %s",
                    safe_repr(getattr(hook, "__self__", hook)),
                    describe(err),
                )

    def expire(self, job: Job) -> None:
        """Fail a job whose call could not be stopped at its time limit (it was abandoned)."""
        self.finish(job, None, job.time_limit_error())

    # -- helpers ---------------------------------------------------------------------------

    def _run_coroutine(self, job: Job) -> Any:
        """Run an ``async def`` task outside the asyncio pool (``loops``)."""
        return self._loops.run(_within_limit(job))

    def _failed(self, job: Job, err: Exception, ran: float | None = None) -> None:
        """A call failed: the retry policy decides (retry or dead letter), the call log logs
        it (``ran``: seconds the call ran, when not timed by ``job``), the acker records it.
        A ``Throttle`` is no failure (``_throttled``)."""
        if isinstance(err, Throttle):
            self._throttled(job, err, ran)
            return
        limits = job.task.limits
        if limits is not None and limits.on_429 is not None:
            throttle = limits.throttle_of(err)
            if throttle is not None:
                throttle.__cause__ = err
                self._throttled(job, throttle, ran)
                return
        self.failed += 1
        self.tally.add(job.delivery.queue, job.task.name, FAILED)
        if self.cancels and job.message.id in self.cancels:
            self._cancelled_running(job, err)
            return
        try:
            outcome = self.retries.decide(job, err)
        except Exception as inner:  # formatting or deciding failed: still an outcome
            job.outcome = Outcome("dead", error=inner, reason="crashed")
            self._after_outcome(job)
            self._crashed(job.delivery, inner, job)
            return
        self.call_log.failed(job, outcome, ran)
        # the hooks run before the hand-off: what they give the acker goes out no later
        job.outcome = outcome
        self._after_outcome(job)
        try:
            if outcome.kind == "retry":
                assert outcome.message is not None
                self.tally.add(job.delivery.queue, job.task.name, RETRIED)
                self.acker.retry(job.delivery, outcome.message)
            else:
                self.tally.add(job.delivery.queue, job.task.name, DEAD_LETTERED)
                self._bury(job.delivery, job.message, outcome.reason, error=outcome.error, job=job)
        except Exception as inner:  # recording failed: still an outcome
            self._crashed(job.delivery, inner, job, ended=outcome.kind == "dead")

    def _throttled(self, job: Job, err: Throttle, ran: float | None) -> None:
        """A call raised ``Throttle``: its message goes back unchanged (same attempt), due in
        its ``retry_after``, and the rate limit of its key, if any, is cut for the time it
        began (``hurtle.adaptive``, ``middleware.limits``)."""
        now = time.time()
        if job.started:
            began = now - (time.monotonic() - job.started)
        else:
            began = now - (ran or 0.0)
        for limits in self.throttles:
            limits.throttled(job, began)
        delay = retry_delay(err.retry_after)
        log.debug(
            "task %s[%s] throttled, deferred for %.3gs: %s",
            job.task.name,
            job.message.id,
            delay,
            err,
        )
        self.acker.defer(job.delivery, now + delay)
        job.outcome = Outcome("deferred", error=err)
        self._after_outcome(job)

    def _cancelled_running(self, job: Job, err: Exception) -> None:
        """A call that ``Hurtle.cancel`` named while it ran ended, however: no retry, a dead
        letter ``cancelled`` and ``cancelled`` records (its own, its workflow's), as for a
        message cancelled before it started."""
        self.cancels.discard(job.message.id)
        error = err if isinstance(err, TaskCancelled) else cancelled_error(job)
        log.info("task %s[%s] was cancelled while it ran", job.task.name, job.message.id)
        job.outcome = Outcome("dead", error=error, reason=CANCELLED)
        self._after_outcome(job)
        try:
            self.tally.add(job.delivery.queue, job.task.name, DEAD_LETTERED)
            self._bury(
                job.delivery,
                job.message,
                CANCELLED,
                state=CANCELLED,
                why="cancelled while it ran",
                job=job,
            )
        except Exception as inner:  # recording failed: still an outcome
            self._crashed(job.delivery, inner, job, ended=True)


def cancelled_error(job: Job) -> TaskCancelled:
    """The error a call cancelled while it ran ends with."""
    return TaskCancelled(f"task {job.task.name}[{job.message.id}] was cancelled while it ran")


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
