"""The batch path of ``Processor``: a batch whose tasks' middleware have batch hooks (or
``after_calls``) is decoded whole, ``before_batch`` sees its jobs and may defer some, the rest run
in one loop, ``after_calls`` settles the calls that returned as columns, then ``after_batch``.
A mixin of ``Processor`` (its methods read the processor's state), kept apart from the inline
path and the per-call steps in ``processor``; what the batch hooks decide is ``admission``."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING

from .._text import describe, safe_repr
from ..brokers import Delivery, StoredResult
from ..errors import HurtleError, TimeLimitExceeded
from ..message import Message, decode_unchecked
from ..middleware import Calls, Job, Middleware, Outcome, Pipeline
from .admission import Admission, _set_aside
from .jobs import BatchState, off_path, take_all

if TYPE_CHECKING:
    from ..brokers.reports import Timings
    from .log import CallLog
    from .screen import Screen

log = logging.getLogger("hurtle.worker.processor")  # the name these lines were always logged under
_clock = time.perf_counter
_PIPELINE_OF = attrgetter("pipeline")
#: The skip set of a processor without a ``Screen``: always empty.
_NO_SKIP: set[int] = set()


class BatchPath(Admission):
    if TYPE_CHECKING:  # what the batch path uses of the ``Processor`` it is mixed into
        call_log: CallLog
        log_calls: bool
        cancels: set[str]
        screen: Screen | None
        timings: Timings
        before_calls: Callable[[], None] | None
        _pipelines: dict[str, Pipeline]

        def pipeline(self, name: str) -> Pipeline | None: ...
        def process(self, delivery: Delivery) -> None: ...
        def run(self, job: Job, state: BatchState | None = None) -> None: ...
        def _after_outcome(self, job: Job) -> None: ...
        def _defer(self, job: Job) -> None: ...
        def _failed(self, job: Job, err: Exception, ran: float | None = None) -> None: ...
        def _overran(self, done: list[Delivery], overran: list[Delivery]) -> None: ...
        def _cancelled_calls(self, done: list[Delivery], returned: Iterable[Calls]) -> None: ...

    # -- batches with batch hooks ----------------------------------------------------------

    def _process_batch(self, deliveries: list[Delivery], state: BatchState) -> None:
        """``process_many`` when middleware has batch hooks: decode the whole batch, show each
        middleware its jobs (``before_batch``), defer what it deferred, run the rest as
        ``process_many`` does, then ``after_batch``. Only tasks with batch hooks or per-call
        hooks get a ``Job``; the others' messages go as they are."""
        runnable: list[Delivery] = []
        items: list[Message | Job] = []  # per runnable delivery: a Message or a Job
        batched: list[Job] = []  # the jobs whose middleware have batch hooks
        counted: dict[Pipeline, list[int]] = {}  # tasks with ``admit``: where their items are
        screened: dict[Pipeline, list[int]] = {}  # tasks with ``superseded``: likewise
        pipelines = self._pipelines
        decode = decode_unchecked
        late: list[tuple[Delivery, str]] = []
        # the last message's task, looked up once per run of one task (a batch is mostly one)
        run_task = ""
        pipeline: Pipeline | None = None
        where: list[int] | None = None  # where the run's items are, when ``admit`` counts them
        seen: list[int] | None = None  # where they are, when ``superseded`` reads them
        plain = False  # the run's messages go as they are (no ``Job``) unless a workflow's
        for delivery in deliveries:
            try:
                message = decode(delivery.raw)
            except Exception:
                self.process(delivery)  # dead-letters it with the reason
                continue
            if message.expires and message.expires <= time.time():
                self._too_late(delivery, message, late)
                continue
            if message.task != run_task or pipeline is None:
                pipeline = pipelines.get(message.task) or self.pipeline(message.task)
                if pipeline is None:  # unknown task
                    self.processed += 1
                    self._unknown(delivery, message)
                    continue
                run_task = message.task
                # counted: ``admit`` decides by task, on counts
                where = counted.setdefault(pipeline, []) if pipeline.admits else None
                seen = screened.setdefault(pipeline, []) if pipeline.screens else None
                plain = pipeline.inline or not (pipeline.grouped or pipeline.per_call)
            if where is not None:
                where.append(len(items))
            if seen is not None:
                seen.append(len(items))
            if plain and not (message.headers and off_path(pipeline.task, message.headers)):
                items.append(message)
            else:
                job = Job(delivery, message, pipeline.task, pipeline, batch=pipeline.batched)
                items.append(job)
                if pipeline.grouped:
                    batched.append(job)
            runnable.append(delivery)
        if late:
            self.acker.dead_letter_many(late)
        deferrals = Job.deferrals
        if screened:
            self._screen(screened, runnable, items)
        if counted:
            self._admit(counted, runnable, items)
        groups: dict[Middleware, list[Job]] = {}
        for pipeline, run in groupby(batched, _PIPELINE_OF):  # a batch is mostly one run
            jobs = list(run)
            for m in pipeline.grouped:
                groups.setdefault(m, []).extend(jobs)
        self._before_batch(groups)
        if Job.deferrals != deferrals:  # some jobs were set aside: they do not run
            kept = [i for i, it in enumerate(items) if not _set_aside(it)]
            superseded: list[Job] = []
            for it in items:
                if type(it) is Job and it.deferred:
                    self._defer(it)  # not counted: it comes back to run later
                elif type(it) is Job and it.superseded:
                    superseded.append(it)
            if superseded:
                self.superseded(superseded)
            runnable = [runnable[i] for i in kept]
            items = [items[i] for i in kept]
        if self.before_calls is not None:  # the broker reads above are done: the prefetch now
            self.before_calls()
        try:
            self._run_items(runnable, items, state)
        finally:
            self._after_batch(groups)

    def _run_items(
        self, runnable: list[Delivery], items: list[Message | Job], state: BatchState
    ) -> None:
        """Run the batch's runnable items in order: a ``Job`` with per-call hooks (or of a
        workflow) through ``run``, anything else called here. Counts, run times and the
        ``Calls`` of ``after_calls`` are kept per run of one task on one queue (a batch is
        mostly one run), as ``process_many`` does: one clock read per call."""
        pipelines = self._pipelines
        log_calls = self.log_calls  # every call gathered in columns, to be logged: see log.py
        done: list[Delivery] = []
        # by task and queue: calls for ``after_calls``, before their acks
        returned: dict[tuple[str, str], Calls] = {}
        counts: dict[tuple[str, str], int] = {}
        started = 0
        runtimes: dict[tuple[str, str], list[float]] = {}
        pending = state.pending = deque(runnable)
        take = pending.popleft
        index = -1  # ``pending`` is taken from the left in order: its index into ``items``
        clock = _clock
        screen = self.screen  # cancellations since the batch was checked: see process_many
        fresh_until = math.inf if screen is None else screen.fresh_until
        skip = _NO_SKIP if screen is None else screen.skip
        # the current run: its pipeline and queue, where its times and calls go, its count
        run_pipeline: Pipeline | None = None
        run_queue = ""
        run_times: list[float] = []
        run_calls: Calls | None = None
        run_count = 0
        last = clock()
        try:
            while True:
                try:
                    delivery = take()
                except IndexError:
                    break
                index += 1
                item = items[index]
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
                started += 1
                job: Job | None = None
                if type(item) is Job:
                    job = item
                    message, pipeline = job.message, job.pipeline
                    assert pipeline is not None
                    if pipeline.per_call or (
                        message.headers and off_path(pipeline.task, message.headers)
                    ):
                        key = (delivery.queue, pipeline.task.name)
                        counts[key] = counts.get(key, 0) + 1
                        state.time_limit = None
                        self.run(job, state)
                        state.current = None
                        last = clock()
                        continue
                else:  # a Message (no isinstance per call: this is the hot loop)
                    message = item  # type: ignore[assignment]
                    pipeline = pipelines[message.task]
                if pipeline is not run_pipeline or delivery.queue != run_queue:
                    if run_pipeline is not None:
                        key = (run_queue, run_pipeline.task.name)
                        counts[key] = counts.get(key, 0) + run_count
                    run_pipeline, run_queue, run_count = pipeline, delivery.queue, 0
                    name = pipeline.task.name
                    run_times = runtimes.setdefault((run_queue, name), [])
                    run_calls = None
                    if pipeline.after_calls or log_calls:
                        run_calls = returned.get((name, run_queue))
                        if run_calls is None:
                            run_calls = returned[name, run_queue] = Calls(pipeline.task)
                            if job is not None:
                                run_calls.jobs = []
                run_count += 1
                task = pipeline.task
                state.time_limit = task.time_limit
                try:
                    # an empty ``**kwargs`` would cost a dict per call
                    if kwargs := message.kwargs:
                        result = task.run(*message.args, **kwargs)
                    else:
                        result = task.run(*message.args)
                except Exception as err:
                    ran = clock() - last
                    run_times.append(ran)
                    state.current = None
                    self._failed(job or Job(delivery, message, task, pipeline), err, ran)
                    last = clock()
                    continue
                now = clock()
                elapsed = now - last
                run_times.append(elapsed)
                last = now
                state.current = None
                if job is not None and pipeline.after_batch:
                    job.outcome = Outcome("ack", result)
                if run_calls is None:
                    done.append(delivery)
                    continue
                run_calls.deliveries.append(delivery)
                run_calls.messages.append(message)
                run_calls.results.append(result)
                run_calls.runtimes.append(elapsed)
                if job is not None and run_calls.jobs is not None:
                    run_calls.jobs.append(job)
        except BaseException:
            state.unstarted.extend(take_all(pending))
            raise
        finally:
            self.processed += started
            if run_pipeline is not None:
                key = (run_queue, run_pipeline.task.name)
                counts[key] = counts.get(key, 0) + run_count
            self.tally.add_many(counts)
            if runtimes:
                self.timings.add_batch(runtimes)
            self._settle_batch(state, done, returned, log_calls)

    def _settle_batch(
        self,
        state: BatchState,
        done: list[Delivery],
        returned: dict[tuple[str, str], Calls],
        log_calls: bool,
    ) -> None:
        """The end of a batch, whichever loop ran it (here or ``process_many``): fail the calls
        that returned after their time limit or their cancellation, acknowledge the rest
        (``done`` at once, the calls gathered in ``returned`` after their ``after_calls``),
        and log those if ``log_calls``."""
        if state.overran:
            _fail_overran(returned.values(), state.overran)
            self._overran(done, state.overran)
        if self.cancels:  # some running message was cancelled: were these calls?
            self._cancelled_calls(done, returned.values())
        if done:
            self.acker.ack_many(done)
        for c in returned.values():
            self._settle_calls(c)
            if log_calls:
                self.call_log.calls(c)

    def _settle_chunk(self, calls: Calls, state: BatchState, log_calls: bool) -> None:
        """Settle ``CALLS_CHUNK`` calls gathered in the middle of a batch (failing those that
        returned after they were interrupted at their time limit), and log them if
        ``log_calls``."""
        if state.overran:
            _fail_overran((calls,), state.overran)
        if self.cancels:
            self._cancelled_calls([], (calls,))
        self._settle_calls(calls)
        if log_calls:
            self.call_log.calls(calls)

    def _settle_calls(self, calls: Calls, job: Job | None = None) -> None:
        """``after_calls`` for calls of one task that returned, then their acknowledgements
        (with the results they store) or, for those failed, their failures. With ``job``: the
        call of that job alone (``finish``), whose failure, if any, is returned to it.

        A hook that raises is run again on each call alone (``_after_calls_one_by_one``): the
        calls it raises on then fail with its error (retried or dead-lettered, with their
        failure records), and the others keep what it records. No call is acknowledged
        without what its hooks record: one ``try`` per hook and part, none per call."""
        if not calls.deliveries:  # a run whose calls all raised, or a chunk just settled
            return
        pipeline = self._pipelines[calls.task.name]
        # calls interrupted at their time limit (``_fail_overran``)
        overran = {i for i, e in calls.failures.items() if isinstance(e, TimeLimitExceeded)}
        for m in pipeline.after_calls:
            before, kept_stored = dict(calls.failures), calls.stored  # as the hook found them
            error: Exception | None = None
            try:
                m.after_calls(calls)
            except Exception as err:
                error = err
            if error is not None:  # what it recorded is unknown: the calls are settled alone
                calls.failures, calls.stored = before, kept_stored
                _after_calls_one_by_one(m, calls, error)
        deliveries, stored = calls.deliveries, calls.stored
        if stored is None and job is not None and job.stored is not None:
            stored = [job.stored]  # set by an ``after_process`` hook
        if stored is not None and len(stored) != len(deliveries):
            error = HurtleError(
                f"middleware set {len(stored)} results to store for {len(deliveries)} calls "
                f"of {calls.task.name}: none could be stored"
            )
            log.error("%s; the calls fail", error)
            for i in range(len(deliveries)):
                calls.failures.setdefault(i, error)
            stored = None
        failures = calls.failures
        if failures:
            for i, failure in sorted(failures.items()):
                failed = job or (
                    calls.jobs[i]
                    if calls.jobs is not None
                    else Job(deliveries[i], calls.messages[i], calls.task, pipeline)
                )
                failing = failed.time_limit_error() if i in overran else failure
                self._failed(failed, failing, calls.runtimes[i])
            kept = [i for i in range(len(deliveries)) if i not in failures]
            deliveries = [deliveries[i] for i in kept]
            if stored is not None:
                stored = [stored[i] for i in kept]
        if not deliveries:
            return
        if stored is None:
            self.acker.ack_many(deliveries)
        else:
            self.acker.ack_many_with_results(deliveries, stored)
        if job is not None:
            job.outcome = Outcome("ack", calls.results[0])
            self._after_outcome(job)


def _after_calls_one_by_one(m: Middleware, calls: Calls, err: Exception) -> None:
    """``m.after_calls`` raised ``err`` on ``calls``: run it on each call alone, so that a
    call it fails on (its result cannot be stored...) fails with the error, and the others
    keep what it records for them. No call is acknowledged without its hooks' records."""
    log.error(
        "middleware %s failed in after_calls on %d calls of %s: %s; settling them one by one",
        safe_repr(m),
        len(calls),
        calls.task.name,
        describe(err),
    )
    if len(calls) == 1:
        calls.failures.setdefault(0, err)
        return
    stored = calls.stored
    rows: list[StoredResult] = []  # one per call; a failed call's is never read
    missing: list[int] = []  # calls it recorded nothing for
    for i in range(len(calls)):
        unused = StoredResult(calls.messages[i].id, b"", 0.0)
        if i in calls.failures:
            rows.append(unused)
            continue
        one = Calls(calls.task)
        one.deliveries.append(calls.deliveries[i])
        one.messages.append(calls.messages[i])
        one.results.append(calls.results[i])
        one.runtimes.append(calls.runtimes[i])
        if calls.jobs is not None:
            one.jobs = [calls.jobs[i]]
        one.stored = None if stored is None else [stored[i]]
        try:
            m.after_calls(one)
            if one.stored is not None and len(one.stored) != 1:
                raise HurtleError(f"it set {len(one.stored)} results to store for one call")
        except Exception as one_err:
            calls.fail(i, one_err)
            rows.append(unused)
            continue
        if one.failures:
            calls.fail(i, one.failures[0])
        if one.stored is None:
            missing.append(i)
            rows.append(unused)
        else:
            rows.append(one.stored[0])
    if len(missing) + len(calls.failures) == len(calls):  # it records nothing for these
        calls.stored = None
        return
    for i in missing:  # it stored records for the others: these fail rather than go without
        calls.fail(i, HurtleError(f"middleware {safe_repr(m)} stored no result for this call"))
    calls.stored = rows


def _fail_overran(returned: Iterable[Calls], overran: list[Delivery]) -> None:
    """Fail the gathered calls that returned after they were interrupted at their time limit
    (``_settle_calls`` makes the error precise)."""
    late = {id(d) for d in overran}
    for c in returned:
        for i, d in enumerate(c.deliveries):
            if id(d) in late:
                c.fail(i, TimeLimitExceeded(""))
