"""Workflow calls on the batch path: the chain links, group and chord members of inline tasks,
called in ``process_many``'s loop as plain calls are (no ``Job``, one clock read per call),
gathered in columns, and settled once per batch.

``FlowCalls.call`` takes a workflow message whose task is inline (no middleware applies, no
time limit), whose arguments are not sealed and which gathers no chord's results (a callback
reads them from the broker first: ``flows.prepare``, on the job path); anything else is left to
the job path. ``settle`` then makes the batch's ``FlowStep``s in one pass, as ``flows.step``
does for one job: each chord's callback message is made once per batch (it is the same for all
its members, which only count), every published message encoded once, the members' result
records from one wall-clock read; and hands them to the acker together, which settles them in
one ``Consumer.ack_flow`` call. A call that raises, is cancelled while it ran, or whose result
or next step cannot be encoded fails as on the job path (``Processor._failed``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..brokers import ChordStep, Delivery, FlowStep, StoredResult
from ..errors import EncodeError, ResultError
from ..flow import Flow, read_flow
from ..message import Message, encode_many
from ..middleware import Job
from ..middleware.results import about, succeeded_record
from ..sealing import SEALED
from .steps import cancelled_error
from .unrun import PROCESSED

if TYPE_CHECKING:
    from ..task import Task
    from .jobs import BatchState
    from .processor import Processor

_clock = time.perf_counter


class FlowCalls:
    """A batch's workflow calls that returned, in columns, until ``settle``."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor
        self.deliveries: list[Delivery] = []
        self.messages: list[Message] = []
        self.flows: list[Flow] = []
        self.results: list[Any] = []
        self.tasks: list[Task[Any, Any]] = []
        #: per call, the clock when it ended and how long it ran
        self.ends: list[float] = []
        self.runtimes: list[float] = []

    def call(self, delivery: Delivery, message: Message, state: BatchState, last: float) -> float:
        """Run ``message`` here if it is a workflow call this path takes, its call started at
        ``last`` (the clock); the clock when it ended, or 0.0 when it is left to the job path."""
        task = self.processor._inline.get(message.task)
        headers = message.headers
        if task is None or task.time_limit is not None or task.keyring or SEALED in headers:
            return 0.0
        try:
            flow = read_flow(message)
        except Exception:  # a header that is no workflow's: the job path says why
            return 0.0
        if flow.gather:
            return 0.0
        try:
            if kwargs := message.kwargs:
                result = task.run(*message.args, **kwargs)
            else:
                result = task.run(*message.args)
        except Exception as err:
            state.current = None
            now = _clock()
            self.processor.tally.add(delivery.queue, task.name, PROCESSED)
            self.processor.timings.add(delivery.queue, task.name, now - last)
            self.processor._failed(_job(delivery, message, task, flow), err, now - last)
            return _clock()
        now = _clock()
        state.current = None
        self.deliveries.append(delivery)
        self.messages.append(message)
        self.flows.append(flow)
        self.results.append(result)
        self.tasks.append(task)
        self.ends.append(now)
        self.runtimes.append(now - last)
        return now

    def settle(self) -> None:
        """Hand the acker the steps of the calls gathered, failing those that cannot go on."""
        p = self.processor
        counts: dict[tuple[str, str], int] = {}
        runtimes: dict[tuple[str, str], list[float]] = {}
        for d, task, ran in zip(self.deliveries, self.tasks, self.runtimes, strict=True):
            key = (d.queue, task.name)
            counts[key] = counts.get(key, 0) + 1
            runtimes.setdefault(key, []).append(ran)
        p.tally.add_many(counts)  # processed, whatever follows
        p.timings.add_batch(runtimes)
        steps: list[FlowStep] = []
        failed: list[tuple[int, Exception]] = []
        cancels = p.cancels
        wall, clock = time.time(), _clock()  # the records' wall times, from one read
        broker = p.app.broker
        most_result, most_message = broker.max_result_size, broker.max_message_size
        callbacks: dict[str, tuple[Message, float]] = {}  # by chord: made once per batch
        published: list[Message] = []
        for i, (d, m, flow, result, task) in enumerate(
            zip(self.deliveries, self.messages, self.flows, self.results, self.tasks, strict=True)
        ):
            if cancels and m.id in cancels:
                failed.append((i, cancelled_error(_job(d, m, task, flow))))
                continue
            try:
                times = (wall, clock, self.ends[i], self.runtimes[i])
                step = _step(p, d, m, flow, result, task, callbacks, most_result, times)
            except Exception as err:
                failed.append((i, err))
                continue
            steps.append(step)
            published += step.publish
        if published:
            try:  # the results are the next steps' arguments: one pass for the batch
                encode_many(published, most_message)
            except EncodeError:
                steps = self._encodable(steps, failed, most_message)
        if steps:
            p.acker.ack_flows(steps)
        for i, error in sorted(failed, key=lambda f: f[0]):
            job = _job(self.deliveries[i], self.messages[i], self.tasks[i], self.flows[i])
            p._failed(job, error, self.runtimes[i])

    def _encodable(
        self, steps: list[FlowStep], failed: list[tuple[int, Exception]], most: int
    ) -> list[FlowStep]:
        """The steps whose messages encode; the others' calls fail with their ``EncodeError``."""
        index = {id(d): i for i, d in enumerate(self.deliveries)}
        kept: list[FlowStep] = []
        for step in steps:
            try:
                encode_many(list(step.publish), most)
            except EncodeError as err:
                failed.append((index[id(step.delivery)], err))
                continue
            kept.append(step)
        return kept


def _step(
    p: Processor,
    d: Delivery,
    m: Message,
    flow: Flow,
    result: Any,
    task: Task[Any, Any],
    callbacks: dict[str, tuple[Message, float]],
    most: int,
    times: tuple[float, float, float, float],
) -> FlowStep:
    """``flows.step`` for a call without a ``Job``; ``times``: the wall clock and the clock
    read together, the clock when the call ended, how long it ran."""
    app = p.app
    record = b""
    if flow.store or flow.chord:
        wall, clock, end, ran = times
        finished = wall - (clock - end)
        fields = about(task.name, m, len(d.raw), finished - ran, finished)
        record = succeeded_record(result, task, m, fields, most)
    results = (StoredResult(m.id, record, flow.store),) if flow.store else ()
    publish: tuple[Message, ...] = ()
    keyring = app.keyring
    if flow.next:
        link, rest = flow.next[0], flow.next[1:]
        store = 0.0 if rest else _ttl(p, link.task)
        publish = (link.message((result,), Flow(id=flow.id, store=store, next=rest), keyring),)
    if flow.steps:  # a nested workflow's next steps, each with its own header
        publish += tuple(s.link.message((result,), s.flow, keyring) for s in flow.steps)
    chord = None
    if flow.chord:
        made = callbacks.get(flow.chord)
        if made is None:
            made = callbacks[flow.chord] = _callback(p, m, flow)
        callback, ttl = made
        chord = ChordStep(flow.chord, flow.index, flow.total, record, ttl, callback)
    return FlowStep(d, results, publish, chord, flow.forget)


def _callback(p: Processor, m: Message, flow: Flow) -> tuple[Message, float]:
    """The message of a chord's callback (the same for every member) and its record's ttl."""
    callback = flow.callback
    if callback is None:
        raise ResultError(f"chord member {m.id} names no callback in its header")
    ttl = _ttl(p, callback.task)
    then = flow.then or Flow(id=flow.id, store=ttl, gather=flow.chord, total=flow.total)
    return callback.message((), then), ttl


def _ttl(p: Processor, task: str) -> float:
    known = p.tasks.get(task)
    return known.result_ttl if known is not None else p.app.settings.result_ttl


def _job(d: Delivery, m: Message, task: Task[Any, Any], flow: Flow) -> Job:
    """A job for a call that fails (``Processor._failed`` takes one)."""
    job = Job(d, m, task, None)
    job.flow = flow
    return job


__all__ = ["FlowCalls"]
