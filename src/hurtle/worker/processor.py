"""``Processor``: runs deliveries — decode, find the task, call it — and decides their outcomes.

Outcomes go to the acker: done (ack), another attempt (retry with backoff), a deferral (put back
unchanged, due later, when a middleware throttles it), or a dead letter with the reason
(undecodable bytes, unknown task, retries exhausted, time limit, ``Reject``, arguments the task
cannot be called with). Nothing here talks to the broker directly, and nothing a task raises
escapes, except ``BaseException``s used to stop the worker. What a failed call leads to is the
built-in ``Retries`` middleware's decision, asked only when a call fails.

Every delivery ends in an outcome. Whatever goes wrong while handling one (an exception whose
``str`` raises, bytes that make the decoder fail in an unexpected way, an error while recording
the outcome) dead-letters that delivery with the reason (``crashed``) instead of killing the
worker or leaving the message in flight: one bad message never stops a fleet. Objects that come
from user code (exceptions, arguments) are formatted with ``describe``/``safe_repr``, which never
raise. A call that raises ``TypeError`` because its arguments do not fit the task's signature is
never retried: no attempt could succeed (checked only when a ``TypeError`` is raised).

Pipelines. Once per task (for the app's tasks when the processor is made, for others when first
seen), the processor composes its ``Pipeline``: the middleware that apply to it and override a
worker-side hook. A task with none, no time limit and no ``async def`` is *inline*: called
directly in ``process_many``'s loop and acknowledged with its batch, whatever other tasks use.
When some middleware has batch hooks, a batch is decoded first, ``before_batch`` sees its jobs
(and may defer some), they run, then ``after_batch``. Only tasks whose middleware need a
``Job`` (batch or per-call hooks) get one per message.

``after_calls`` (the batch-wide ``after_process`` of the success path) sees, per task, the
calls that returned as columns (``Calls``: deliveries, messages, return values), before their
acknowledgements are handed to the acker; a task whose middleware have only ``after_calls``,
``after_outcome`` and batch hooks is called in the batch loop like an inline one, its return
values appended to those columns, and its hooks run once per batch (``_settle_calls``).

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

A result rides its acknowledgement: the results middleware's ``after_calls`` sets
``Calls.stored`` (one ``StoredResult`` per call), and the calls are acknowledged with
``Acker.ack_many_with_results``, in the same broker call as the other acknowledgements of its
flush. Only tasks that keep results have that middleware in their pipeline: the others stay
inline.

Expiry. A message whose ``expires`` time passed before it started is not run: each path that
decodes a delivery checks that field (one compare per message, the clock read only for messages
that have one), and ``_too_late`` hands it to the acker as a dead letter with the reason
``expired`` (the acker records the dead letters of a flush in one broker call) and, for a task
that keeps results, an ``expired`` record for its handle.

Time limits are the executor's business (``Limit``): only it knows how a running call can be
stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .._text import describe, safe_repr, safe_str
from ..brokers import Delivery
from ..brokers.reports import Tally, Timings
from ..errors import HurtleError
from ..message import Message, decode_unchecked
from ..middleware import Calls, Middleware, Outcome, overrides
from ..middleware.retries import Retries
from ..workflows import FLOW
from . import flows
from .acker import Acker
from .batch import _NO_SKIP, BatchPath, _fail_overran
from .jobs import BatchState, Job, Limit, Pipeline, late_limit, take_all
from .unrun import DEAD_LETTERED, FAILED, PROCESSED, RETRIED, NotRun

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..task import Task
    from .screen import Screen

log = logging.getLogger(__name__)
_decode = Message.decode
_clock = time.perf_counter


def _ignore(_: object) -> None:
    """An append of the inline loop when its run keeps no columns (never called)."""


__all__ = [
    "BatchState",
    "Job",
    "Limit",
    "Pipeline",
    "Processor",
    "describe",
    "late_limit",
    "safe_repr",
    "safe_str",
]


class Processor(BatchPath, NotRun):
    def __init__(
        self,
        app: Hurtle,
        acker: Acker,
        middleware: Sequence[Middleware] = (),
        *,
        limit: Limit = late_limit,
        loops_take_turns: bool = False,
        inline_limits: bool = False,
    ) -> None:
        self.app = app
        #: True when the executor enforces time limits of inline tasks (``BatchState``).
        self.inline_limits = inline_limits
        self.tasks = app.tasks
        self.acker = acker
        self.middleware = list(middleware)
        self.retries = next(
            (m for m in self.middleware if isinstance(m, Retries)), None
        ) or Retries(app.settings.max_retry_delay)
        self.limit = limit
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        # Greenlets share one OS thread, and asyncio allows one running loop per OS thread: in
        # greenlet pools, ``async def`` tasks take turns.
        self._turns: AbstractContextManager[Any] = (
            threading.Lock() if loops_take_turns else contextlib.nullcontext()
        )
        #: Pipelines by task name, composed once per task; ``_inline`` holds the inline tasks,
        #: ``_columned`` the pipelines of tasks whose middleware has only ``after_calls`` (and
        #: ``after_outcome`` beside it): ``process_many`` calls those inline too, gathering the
        #: calls that returned as columns for the hooks.
        self._pipelines: dict[str, Pipeline] = {}
        self._inline: dict[str, Task[Any, Any]] = {}
        self._columned: dict[str, Pipeline] = {}
        #: Both kinds, the tasks ``process_many`` calls itself: one lookup per message.
        self._called: dict[str, Task[Any, Any]] = {}
        #: True when some middleware has batch hooks: batches are then decoded before they run.
        self._batch_hooks = any(
            overrides(m, hook) for m in self.middleware for hook in ("before_batch", "after_batch")
        )
        for name in list(self.tasks):
            self.pipeline(name)
        #: Deliveries taken in hand (whatever the outcome), for progress reports.
        self.processed = 0
        self.failed = 0
        #: The same per queue and task, with retries and dead letters: sent with heartbeats.
        self.tally = Tally()
        #: Run times per queue and task (one clock read per call, bucketed once per batch).
        self.timings = Timings()
        #: Cancellations recorded after a delivery was fetched (set by the worker; None: no
        #: check before a task starts).
        self.screen: Screen | None = None

    def pipeline(self, name: str) -> Pipeline | None:
        """The pipeline of the task called ``name`` (composed on first sight), None if unknown."""
        pipeline = self._pipelines.get(name)
        if pipeline is None:
            task = self.tasks.get(name)
            if task is None:
                return None
            pipeline = self._pipelines[name] = Pipeline(task, self.middleware, self.inline_limits)
            if pipeline.inline:
                self._inline[name] = self._called[name] = task
            elif pipeline.after_calls and not (pipeline.per_call or pipeline.batched):
                self._columned[name] = pipeline
                self._called[name] = task
        return pipeline

    # -- the short path --------------------------------------------------------------------

    def screened_out(self, delivery: Delivery) -> bool:
        """True when ``delivery``, about to start, turned out cancelled (``Screen``): its
        outcome is recorded, and it must not run."""
        screen = self.screen
        if screen is None:
            return False
        now = _clock()
        if now > screen.fresh_until:
            screen.ensure(now, delivery)
        return screen.taken(delivery)

    def process(self, delivery: Delivery) -> None:
        """Run one delivery to its outcome (keep it short; no ``Job`` for an inline task)."""
        if self.screen is not None and self.screened_out(delivery):
            return
        self.processed += 1
        try:
            message = _decode(delivery.raw)
        except Exception as err:  # DecodeError, or whatever the decoder let escape
            self._undecodable(delivery, err)
            return
        if message.expires and message.expires <= time.time():
            self.processed -= 1  # counted above
            self._too_late(delivery, message)
            return
        task = self._inline.get(message.task)
        if task is None or (message.headers and FLOW in message.headers):
            job = self._job(delivery, message)
            if job is not None:
                self.run(job)
            return
        self.tally.add(delivery.queue, task.name, PROCESSED)
        begin = _clock()
        try:
            task.fn(*message.args, **message.kwargs)
        except Exception as err:
            self.timings.add(delivery.queue, task.name, _clock() - begin)
            self._failed(Job(delivery, message, task), err)
            return
        self.timings.add(delivery.queue, task.name, _clock() - begin)
        self.acker.ack(delivery)

    def process_many(self, deliveries: list[Delivery], state: BatchState) -> None:
        """Run a batch one delivery after another on this thread (solo, and each thread's share
        of a batch in the threads pool).

        Inline tasks are called here and acknowledged together once the batch is done; so are
        the tasks whose middleware has only ``after_calls``, whose calls that returned are
        gathered per task (``Calls``) and settled after the batch. Anything else (bad bytes,
        unknown tasks, tasks with per-call hooks) takes ``run``. When middleware has batch hooks
        (``before_batch``, ``after_batch``), the batch takes ``_process_batch`` instead.
        """
        if self._batch_hooks:
            self._process_batch(deliveries, state)
            return
        called = self._called
        columned = self._columned
        returned: dict[str, Calls] = {}  # by task: the calls ``after_calls`` settles
        # the current run's Calls, when its task has ``after_calls``: its columns' appends
        add_delivery: Callable[[Delivery], None] | None = None
        add_message: Callable[[Message], None] = _ignore
        add_result: Callable[[Any], None] = _ignore
        add_runtime: Callable[[float], None] = _ignore
        decode = decode_unchecked
        done: list[Delivery] = []
        started = 0
        # Counted per run of one task on one queue (a batch is mostly one run): two compares
        # per task rather than a dict update.
        counts: dict[tuple[str, str], int] = {}
        run_task: Task[Any, Any] | None = None
        run_queue = ""
        run_start = 0
        late: list[tuple[Delivery, str]] = []  # expired: dead-lettered together at the end
        # Run times, per (queue, task): one clock read per call (the end of one call starts the
        # next), bucketed once the batch is done.
        clock = _clock
        runtimes: dict[tuple[str, str], list[float]] = {}
        run_times: list[float] = []
        pending = state.pending = deque(deliveries)
        take = pending.popleft
        # cancellations recorded since the deliveries were checked (``Screen``): one compare
        # per task, a broker call only when the bound is passed
        screen = self.screen
        fresh_until = math.inf if screen is None else screen.fresh_until
        skip = _NO_SKIP if screen is None else screen.skip
        last = clock()
        try:
            while True:
                try:
                    delivery = take()
                except IndexError:  # all taken (some perhaps handed back by another thread)
                    break
                if last > fresh_until:
                    assert screen is not None
                    fresh_until = screen.ensure(last, delivery)
                if skip and id(delivery) in skip:  # cancelled while it waited: recorded
                    skip.discard(id(delivery))
                    continue
                state.current = delivery
                if state.stopping:
                    state.current = None
                    state.unstarted.append(delivery)
                    state.unstarted.extend(take_all(pending))
                    break
                try:
                    message = decode(delivery.raw)
                    task = called.get(message.task)
                    if task is not None and message.headers and FLOW in message.headers:
                        task = None  # a workflow's: its outcome sets off the next step
                except Exception:
                    state.current = None
                    self.process(delivery)  # dead-letters it with the reason
                    last = clock()
                    continue
                if message.expires and message.expires <= time.time():
                    state.current = None
                    self._too_late(delivery, message, late)
                    last = clock()
                    continue
                if task is not run_task or delivery.queue != run_queue:
                    if run_task is not None:
                        key = (run_queue, run_task.name)
                        counts[key] = counts.get(key, 0) + started - run_start
                    run_task, run_queue, run_start = task, delivery.queue, started
                    if task is not None:
                        run_times = runtimes.setdefault((run_queue, task.name), [])
                        add_delivery = None
                        if task.name in columned:
                            run_calls = returned.get(task.name)
                            if run_calls is None:
                                run_calls = returned[task.name] = Calls(task)
                            add_delivery = run_calls.deliveries.append
                            add_message = run_calls.messages.append
                            add_result = run_calls.results.append
                            add_runtime = run_calls.runtimes.append
                started += 1
                if task is None:  # not inline (or unknown: dead-lettered); timed in ``finish``
                    state.time_limit = None
                    if (job := self._job(delivery, message)) is not None:
                        self.run(job, state)
                    state.current = None
                    last = clock()
                    continue
                state.time_limit = task.time_limit
                try:
                    result = task.fn(*message.args, **message.kwargs)
                except Exception as err:
                    state.current = None
                    run_times.append(clock() - last)
                    self._failed(Job(delivery, message, task, columned.get(task.name)), err)
                    last = clock()
                    continue
                state.current = None  # before the outcome: a hard stop now hands nothing back
                now = clock()
                if add_delivery is None:
                    run_times.append(now - last)
                    done.append(delivery)
                else:
                    ran = now - last
                    run_times.append(ran)
                    add_delivery(delivery)
                    add_message(message)
                    add_result(result)
                    add_runtime(ran)
                last = now
        except BaseException:  # a hard stop raised in a task: the rest goes back unstarted
            state.unstarted.extend(take_all(pending))
            raise
        finally:  # also when a hard stop raises in a task: what finished is acknowledged
            self.processed += started
            if run_task is not None:
                key = (run_queue, run_task.name)
                counts[key] = counts.get(key, 0) + started - run_start
                self.tally.add_many(counts)
            if runtimes:
                self.timings.add_batch(runtimes)
            if state.overran:
                _fail_overran(returned.values(), state.overran)
                self._overran(done, state.overran)
            if done:
                self.acker.ack_many(done)
            for c in returned.values():
                self._settle_calls(c)
            if late:
                self.acker.dead_letter_many(late)

    def _overran(self, done: list[Delivery], overran: list[Delivery]) -> None:
        """Fail the inline calls that returned after they were interrupted at their limit."""
        late = {id(d) for d in overran}
        overran.clear()
        for delivery in [d for d in done if id(d) in late]:
            done.remove(delivery)
            job = self.begin(delivery)
            self.processed -= 1  # counted already
            if job is not None:
                self._failed(job, job.time_limit_error())

    # -- the steps -------------------------------------------------------------------------

    def _job(self, delivery: Delivery, message: Message) -> Job | None:
        """A job for a decoded message, with its task's pipeline; dead-letters an unknown task
        (and returns None)."""
        pipeline = self.pipeline(message.task)
        if pipeline is None:
            self._unknown(delivery, message)
            return None
        self.tally.add(delivery.queue, message.task, PROCESSED)
        return Job(delivery, message, pipeline.task, pipeline)

    def begin(self, delivery: Delivery) -> Job | None:
        """Decode and find the task; dead-letter (and return None) what cannot run."""
        self.processed += 1
        try:
            message = _decode(delivery.raw)
        except Exception as err:  # DecodeError, or whatever the decoder let escape
            self._undecodable(delivery, err)
            return None
        if message.expires and message.expires <= time.time():
            self.processed -= 1  # counted above
            self._too_late(delivery, message)
            return None
        return self._job(delivery, message)

    def run(self, job: Job, state: BatchState | None = None) -> None:
        """Call the task on this thread (within its time limit), then settle the outcome.

        With ``state`` (the solo pool), ``state.current`` is cleared once the call returned. A
        job outside a batch whose pipeline has batch hooks is a batch of one.
        """
        if self._alone(job):
            return
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
        if self._alone(job):
            return
        result: Any = None
        error: Exception | None = None
        try:
            self._start(job)
            result = await _within_limit(job)
        except Exception as err:
            error = err
        self.finish(job, result, error)

    def _alone(self, job: Job) -> bool:
        """Run ``before_batch`` for a batched job met on its own; True when it was deferred."""
        pipeline = job.pipeline
        if pipeline is None or not pipeline.batched or job.batch:
            return False
        job.alone = True  # its batch is itself: ``finish`` runs ``after_batch``
        self._before_batch({m: [job] for m in pipeline.before_batch})
        if job.deferred:
            self._defer(job)
            self._after_batch({m: [job] for m in pipeline.after_batch})
            return True
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
        """Run an ``async def`` task outside the asyncio pool, on this thread's own loop."""
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            self._loops.append(loop)
        with self._turns:
            return loop.run_until_complete(_within_limit(job))

    def _failed(self, job: Job, err: Exception) -> None:
        """A call failed: the retry policy decides (retry or dead letter), the acker records."""
        self.failed += 1
        self.tally.add(job.delivery.queue, job.task.name, FAILED)
        try:
            outcome = self.retries.decide(job, err)
        except Exception as inner:  # formatting or deciding failed: still an outcome
            job.outcome = Outcome("dead", error=inner, reason="crashed")
            self._after_outcome(job)
            self._flow_failed(job, inner, "crashed")
            self._crashed(job.delivery, inner)
            return
        # the hooks run before the hand-off: what they give the acker goes out no later
        job.outcome = outcome
        self._after_outcome(job)
        if outcome.kind == "dead":
            self._flow_failed(job, outcome.error, outcome.reason)
        try:
            if outcome.kind == "retry":
                assert outcome.message is not None
                self.tally.add(job.delivery.queue, job.task.name, RETRIED)
                self.acker.retry(job.delivery, outcome.message)
            else:
                self.tally.add(job.delivery.queue, job.task.name, DEAD_LETTERED)
                self.acker.dead_letter(job.delivery, outcome.reason)
        except Exception as inner:  # recording failed: still an outcome
            self._crashed(job.delivery, inner)

    def _flow_failed(self, job: Job, error: BaseException | None, reason: str) -> None:
        """A workflow member failed for good: its workflow fails now (recorded before the
        dead letter is handed to the acker, so it goes out no later)."""
        if job.flow is None and not flows.is_flow(job.message):
            return
        try:
            record = flows.failure(job, error, reason)
        except Exception as err:  # never in the way of the dead letter itself
            log.error("could not record the failure of workflow member %s: %s", job.message.id, err)
            return
        if record is not None:
            self.acker.store_result(record.id, record.payload, record.ttl)

    def close(self) -> None:
        for loop in self._loops:
            if not loop.is_running():
                loop.close()
        self._loops.clear()


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
