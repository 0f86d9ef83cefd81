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
values appended to those columns, and its hooks run once per batch (``_settle_calls``), or
once per ``CALLS_CHUNK`` calls in a long one.

A delivery of a non-inline task goes through three steps, ``begin``, the call and ``finish``
(``steps``, a mixin of ``Processor``), which executors may drive separately.

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

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._text import describe, safe_repr, safe_str
from ..brokers import Delivery
from ..brokers.reports import RUNTIME_BUCKETS, Tally, Timings
from ..errors import TaskCancelled
from ..flow import FLOW
from ..message import Message, decode_unchecked, message_id
from ..middleware import Calls, Job, Middleware, Pipeline, overrides
from ..middleware.limits import RateLimitMiddleware
from ..middleware.retries import Retries
from ..sealing import SEALED
from .acker import Acker
from .batch import _NO_SKIP, BatchPath
from .flowcalls import FlowCalls
from .jobs import BatchState, Limit, late_limit, off_path, take_all
from .log import CallLog
from .loops import Loops
from .steps import JobSteps, cancelled_error
from .unrun import PROCESSED

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..context import Tracker
    from ..task import Task
    from .screen import Screen

log = logging.getLogger(__name__)
_decode = Message.decode
_clock = time.perf_counter


#: Calls of one task gathered in columns before ``after_calls`` settles them, also in the middle
#: of a batch: a thousand calls kept to the batch's end (their messages, arguments and return
#: values) outgrow the CPU's cache, and every pass of the hooks over them then waits on memory;
#: this many stay in it, and the hooks still run once per this many calls.
CALLS_CHUNK = 128
#: Seconds a call may last and still fall in the run-time histograms' first bucket.
FIRST_BUCKET = RUNTIME_BUCKETS[0]


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


class Processor(BatchPath, JobSteps):
    def __init__(
        self,
        app: Hurtle,
        acker: Acker,
        middleware: Sequence[Middleware] = (),
        *,
        limit: Limit = late_limit,
        shared_loop: bool = False,
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
        #: The rate-limit middleware, told of calls that raised ``Throttle`` (``_throttled``).
        self.throttles = [m for m in self.middleware if isinstance(m, RateLimitMiddleware)]
        self.limit = limit
        #: Where ``async def`` tasks run outside the asyncio pool: a loop per thread, or one
        #: shared loop in greenlet pools (greenlets share one OS thread; ``loops``).
        self._loops = Loops(shared=shared_loop)
        #: Pipelines by task name, composed once per task; ``_inline`` holds the inline tasks,
        #: ``_columned`` the pipelines of tasks whose middleware has only ``after_calls`` (and
        #: ``after_outcome`` beside it): ``process_many`` calls those inline too, gathering the
        #: calls that returned as columns for the hooks.
        self._pipelines: dict[str, Pipeline] = {}
        self._inline: dict[str, Task[Any, Any]] = {}
        self._columned: dict[str, Pipeline] = {}
        #: Both kinds, the tasks ``process_many`` calls itself: one lookup per message.
        self._called: dict[str, Task[Any, Any]] = {}
        #: The pipelines of those tasks, all gathered in columns in a batch whose calls are
        #: logged one by one (``log_calls``).
        self._logged: dict[str, Pipeline] = {}
        #: True when some middleware has batch hooks: batches are then decoded before they run.
        self._batch_hooks = any(
            overrides(m, hook) for m in self.middleware for hook in ("before_batch", "after_batch")
        )
        for name in list(self.tasks):
            self.pipeline(name)
        #: True when some middleware decides on a batch before its calls run (``before_batch``,
        #: and ``admit`` or ``superseded`` beside it), which may read the broker.
        self.decides_before_calls = any(overrides(m, "before_batch") for m in self.middleware)
        #: Called once a batch's middleware have read what they read from the broker, just
        #: before its calls run (set by the worker: the solo loop's prefetch, which the broker
        #: would otherwise run in front of those reads; None: nothing).
        self.before_calls: Callable[[], None] | None = None
        #: Deliveries taken in hand (whatever the outcome; not a deferral), for progress reports.
        self.processed = 0
        self.failed = 0
        #: The same per queue and task, with retries and dead letters: sent with heartbeats.
        self.tally = Tally()
        #: Run times per queue and task (one clock read per call, bucketed once per batch).
        self.timings = Timings()
        #: Cancellations recorded after a delivery was fetched (set by the worker; None: no
        #: check before a task starts).
        self.screen: Screen | None = None
        #: Where the tasks' ``hurtle.current()`` sends progress and learns of cancellations (set
        #: by the worker before its executor starts; None: no context).
        self.tracker: Tracker | None = None
        #: Ids of running messages that ``Hurtle.cancel`` named (the tracker's set, shared): a
        #: call of one is recorded ``cancelled`` whatever it returns, checked once per batch
        #: (per call on the job path) and only while the set is not empty.
        self.cancels: set[str] = set()
        #: What the worker says it ran (``log``): set by the worker, with its options.
        self.call_log = CallLog(self.tally)
        #: True when the calls of the batches starting now are logged one by one (set once per
        #: fetched batch by the worker: ``CallLog.admit``), read once per batch.
        self.log_calls = False

    def pipeline(self, name: str) -> Pipeline | None:
        """The pipeline of the task called ``name`` (composed on first sight), None if unknown."""
        pipeline = self._pipelines.get(name)
        if pipeline is None:
            task = self.tasks.get(name) or self.app.builtin(name)  # hurtle.collect
            if task is None:
                return None
            pipeline = self._pipelines[name] = Pipeline(task, self.middleware, self.inline_limits)
            if pipeline.inline:
                self._inline[name] = self._called[name] = task
                self._logged[name] = pipeline
            elif pipeline.after_calls and not (pipeline.per_call or pipeline.batched):
                self._columned[name] = self._logged[name] = pipeline
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
        # a call logged one by one takes the job path, whose ``finish`` logs it
        if task is None or self.log_calls or (message.headers and off_path(task, message.headers)):
            job = self._job(delivery, message)
            if job is not None:
                self.run(job)
            return
        self.tally.add(delivery.queue, task.name, PROCESSED)
        begin = _clock()
        try:
            task.run(*message.args, **message.kwargs)
        except Exception as err:
            ran = _clock() - begin
            self.timings.add(delivery.queue, task.name, ran)
            self._failed(Job(delivery, message, task), err, ran)
            return
        self.timings.add(delivery.queue, task.name, _clock() - begin)
        if self.cancels and message.id in self.cancels:  # cancelled while it ran
            self._failed(
                Job(delivery, message, task), cancelled_error(Job(delivery, message, task))
            )
            return
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
        # A batch whose calls are logged one by one gathers every task's calls in columns
        # (``Calls``), and logs them once they are settled.
        log_calls = self.log_calls
        columned = self._logged if log_calls else self._columned
        # by task and queue: the calls ``after_calls`` settles
        returned: dict[tuple[str, str], Calls] = {}
        # The current run's Calls when its task has ``after_calls`` (else None), and its columns
        # (lists: ``column.append(x)`` is a specialized instruction, a bound ``append`` a call)
        run_calls: Calls | None = None
        call_deliveries: list[Delivery] = []
        call_messages: list[Message] = []
        call_results: list[Any] = []
        call_runtimes: list[float] = []
        room = 0  # calls the current run's Calls takes before it is settled
        decode = decode_unchecked
        done: list[Delivery] = []
        started = 0
        # workflow calls of inline tasks, called here too (``flowcalls``): settled at the end
        flowing = None if log_calls else FlowCalls(self)
        # Counted per run of one task on one queue (a batch is mostly one run): two compares
        # per task rather than a dict update.
        counts: dict[tuple[str, str], int] = {}
        run_task: Task[Any, Any] | None = None
        run_queue = ""
        run_start = 0
        late: list[tuple[Delivery, str]] = []  # expired: dead-lettered together at the end
        # Run times, per (queue, task): one clock read per call (the end of one call starts the
        # next). Calls that go the way of most, all within the first bucket of the histograms,
        # are counted, not kept: a *span* of a run's calls that ends within ``FIRST_BUCKET`` of
        # its start holds only such calls (each lasted no longer than the span), and its length
        # is their sum. A call that ends past ``span_end`` is kept on its own, and a span starts
        # after it; what is not a call of the run (a message dead-lettered, a failure) moves
        # the span on by its duration. Kept times are bucketed once the batch is done.
        clock = _clock
        runtimes: dict[tuple[str, str], list[float]] = {}
        run_times: list[float] = []
        spans: dict[tuple[str, str], tuple[int, float]] = {}
        span_calls = 0
        span_start = span_end = 0.0
        call: Any = None  # the running task's function
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
                    # ``off_path`` written out: a workflow's, or sealed for a task that is not,
                    # takes ``run`` (read only for messages with headers)
                    if (
                        task is not None
                        and (headers := message.headers)
                        and (FLOW in headers or (SEALED in headers and not task.encrypt))
                    ):
                        task = None
                except Exception:
                    state.current = None
                    self.process(delivery)  # dead-letters it with the reason
                    now = clock()
                    span_start += now - last
                    span_end += now - last
                    last = now
                    continue
                if message.expires and message.expires <= time.time():
                    state.current = None
                    self._too_late(delivery, message, late)
                    now = clock()
                    span_start += now - last
                    span_end += now - last
                    last = now
                    continue
                if task is not run_task or delivery.queue != run_queue:
                    if run_task is not None:
                        key = (run_queue, run_task.name)
                        counts[key] = counts.get(key, 0) + started - run_start
                        if span_calls:
                            _add_span(spans, key, span_calls, last - span_start)
                    run_task, run_queue, run_start = task, delivery.queue, started
                    span_calls, span_start, span_end = 0, last, last + FIRST_BUCKET
                    if task is not None:
                        call = task.run
                        state.time_limit = task.time_limit  # the same for the whole run
                        run_times = runtimes.setdefault((run_queue, task.name), [])
                        run_calls = None
                        if task.name in columned:
                            run_calls = returned.get((task.name, run_queue))
                            if run_calls is None:
                                run_calls = returned[task.name, run_queue] = Calls(task)
                            call_deliveries = run_calls.deliveries
                            call_messages = run_calls.messages
                            call_results = run_calls.results
                            call_runtimes = run_calls.runtimes
                            room = CALLS_CHUNK - len(call_deliveries)
                started += 1
                if task is None:  # not inline (or unknown: dead-lettered); timed in ``finish``
                    state.time_limit = None
                    if flowing is not None and (
                        end := flowing.call(delivery, message, state, last)
                    ):
                        last = end
                        continue
                    if (job := self._job(delivery, message)) is not None:
                        self.run(job, state)
                    state.current = None
                    last = clock()
                    continue
                try:
                    # an empty ``**kwargs`` would cost a dict per call
                    if kwargs := message.kwargs:
                        result = call(*message.args, **kwargs)
                    else:
                        result = call(*message.args)
                except Exception as err:
                    state.current = None
                    ran = clock() - last
                    run_times.append(ran)
                    pipeline = self._columned.get(task.name)
                    self._failed(Job(delivery, message, task, pipeline), err, ran)
                    now = clock()
                    span_start += now - last
                    span_end += now - last
                    last = now
                    continue
                state.current = None  # before the outcome: a hard stop now hands nothing back
                now = clock()
                if run_calls is None:
                    if now <= span_end:
                        span_calls += 1
                    else:  # the span's calls ended by ``last``; this one is kept on its own
                        if span_calls:
                            _add_span(spans, (run_queue, task.name), span_calls, last - span_start)
                        run_times.append(now - last)
                        span_calls, span_start, span_end = 0, now, now + FIRST_BUCKET
                    done.append(delivery)
                else:
                    ran = now - last
                    run_times.append(ran)
                    call_deliveries.append(delivery)
                    call_messages.append(message)
                    call_results.append(result)
                    call_runtimes.append(ran)
                    room -= 1
                    if room == 0:  # settled now, while its objects are still in the cache
                        self._settle_chunk(run_calls, state, log_calls)
                        run_calls = returned[task.name, run_queue] = Calls(task)
                        call_deliveries = run_calls.deliveries
                        call_messages = run_calls.messages
                        call_results = run_calls.results
                        call_runtimes = run_calls.runtimes
                        room = CALLS_CHUNK
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
                if span_calls:
                    _add_span(spans, key, span_calls, last - span_start)
            if runtimes or spans:
                self.timings.add_batch(runtimes, spans)
            self._settle_batch(state, done, returned, log_calls)
            if flowing is not None and flowing.deliveries:
                flowing.settle()
            if late:
                self.acker.dead_letter_many(late)

    def _overran(self, done: list[Delivery], overran: list[Delivery]) -> None:
        """Fail the inline calls that returned after they were interrupted at their limit."""
        late = {id(d) for d in overran}
        overran.clear()
        for delivery in [d for d in done if id(d) in late]:
            done.remove(delivery)
            job = self.begin(delivery, count=False)  # counted already
            if job is not None:
                self._failed(job, job.time_limit_error())

    def _cancelled_calls(self, done: list[Delivery], returned: Iterable[Calls]) -> None:
        """Fail, as cancelled (``_failed`` records them so), the calls of a batch that returned
        although ``Hurtle.cancel`` named their message while they ran: the acknowledged ones
        (``done``, taken out of it) and those gathered for ``after_calls``."""
        cancels = self.cancels
        for c in returned:
            for i, m in enumerate(c.messages):
                if m.id in cancels:
                    c.fail(i, TaskCancelled(f"task {m.task}[{m.id}] was cancelled while it ran"))
        gone = [d for d in done if message_id(d.raw) in cancels]
        for delivery in gone:
            done.remove(delivery)
            job = self.begin(delivery, count=False)  # counted already
            if job is not None:
                self._failed(job, cancelled_error(job))

    def close(self) -> None:
        self._loops.close()


def _add_span(
    spans: dict[tuple[str, str], tuple[int, float]], key: tuple[str, str], calls: int, took: float
) -> None:
    """Count ``calls`` calls of ``key`` that took ``took`` seconds in all, each within
    ``FIRST_BUCKET``."""
    had = spans.get(key)
    spans[key] = (calls, took) if had is None else (had[0] + calls, had[1] + took)
