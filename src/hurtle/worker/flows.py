"""Workflows, worker side: what a chain link or chord member sets off when it ends.

The processor sends a message carrying ``headers["flow"]`` (``hurtle.workflows.Flow``) down its
job path, whatever its task, and asks this module two things:

* ``prepare`` before the call: a chord's callback gets its chord's results, read once in one
  broker call (``Broker.chord_results``) and opened where they are sealed, as its first
  argument (sealed again with the callback's own arguments if any of them, or those, were);
* ``step`` once the call returned: the ``FlowStep`` to hand the acker instead of a plain
  acknowledgement — the records to store (the workflow's result), the next link's message, the
  chord member's count and the callback to publish if it completes the chord — which the broker
  applies in one atomic step with the acknowledgement (``Consumer.ack_flow``).

What a member that becomes a dead letter ends (its workflow's record, naming it) is decided
with every other dead letter's ends, in ``ends``.

A chain passes a result on sealed when the task that returned it is encrypted, or the next
link's is (its arguments travel sealed in the header): the next message's arguments are then
sealed, whatever the next task (``Job.call`` opens them for a task that does not seal its own).

Messages without the header never come here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ..brokers import ChordStep, FlowStep, StoredResult
from ..errors import ResultError
from ..flow import FLOW, Flow, Link, read_flow
from ..message import Message, encode_many
from ..middleware.results import encode_value
from ..records import Record, decode
from ..sealing import SEALED, is_sealed, is_sealed_message, no_keys

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..middleware import Job

_encode = msgspec.msgpack.Encoder().encode
_replace = msgspec.structs.replace


def is_flow(message: Message) -> bool:
    """True when ``message`` is part of a workflow."""
    headers = message.headers
    return bool(headers) and FLOW in headers


def _ttl(app: Hurtle, task: str) -> float:
    known = app.tasks.get(task)
    return known.result_ttl if known is not None else app.settings.result_ttl


def prepare(job: Job, app: Hurtle) -> Flow:
    """Read the job's workflow header; a chord's callback gets its chord's results first."""
    flow = read_flow(job.message)
    if flow.gather:
        payloads = app.broker.chord_results(flow.gather, flow.gathers or flow.total)
        if payloads is None:
            raise ResultError(
                f"the results of chord {flow.gather} are gone (expired, or the broker lost "
                f"them): its callback {job.task.name}[{job.message.id}] cannot run"
            )
        records = [decode(p) for p in payloads]
        sealed = any(is_sealed(r.value) for r in records)
        values = [_opened(r, app) for r in records] if sealed else [r.value for r in records]
        m = job.message
        # the gathered results travel with the message from now on (a retry keeps them); the
        # chord's record is dropped once the callback is done with it
        flow = _replace(flow, gather="", gathers=0, forget=flow.gather)
        headed = _replace(m, headers={**m.headers, FLOW: flow})
        if is_sealed_message(m) or sealed:  # they travel sealed too
            keyring = app.keyring
            if keyring is None:
                raise no_keys(f"results of chord {flow.forget}")
            if is_sealed_message(m):
                job.message = keyring.prepend(headed, (values,))
            else:
                job.message = keyring.seal_message(_replace(headed, args=(values, *m.args)))
        else:
            job.message = _replace(headed, args=(values, *m.args))
    job.flow = flow
    return flow


def step(job: Job, result: Any, app: Hurtle) -> FlowStep:
    """The acknowledgement of a workflow job that returned ``result``, with what it sets off.

    Raises ``ResultError`` when ``result`` cannot be encoded or stored, and ``EncodeError``
    when the next link it is passed to is over the broker's size limit (the call then fails)."""
    flow = job.flow if job.flow is not None else prepare_header(job)
    m = job.message
    results: list[StoredResult] = []
    if job.stored is not None:
        results.append(job.stored)
    if flow.store and (job.stored is None or job.stored.id != m.id):
        most = app.broker.max_result_size
        results.append(StoredResult(m.id, encode_value(result, job, most), flow.store))
    publish: tuple[Message, ...] = ()
    if flow.next:
        link, rest = flow.next[0], flow.next[1:]
        store = 0.0 if rest else _ttl(app, link.task)
        publish = (_passed(job, app, result, link, Flow(id=flow.id, store=store, next=rest)),)
    if flow.steps:  # a nested workflow's next steps, each with its own header
        publish += tuple(_passed(job, app, result, s.link, s.flow) for s in flow.steps)
    if publish:
        # the result is the next steps' argument: an EncodeError now fails this call
        encode_many(list(publish), app.broker.max_message_size)
    chord = None
    if flow.chord:
        callback = flow.callback
        if callback is None:
            raise ResultError(f"chord member {m.id} names no callback in its header")
        then = flow.then  # a nested workflow's callback header says what it sets off
        if then is None:
            ttl = _ttl(app, callback.task)
            then = Flow(id=flow.id, store=ttl, gather=flow.chord, total=flow.total)
        chord = ChordStep(
            id=flow.chord,
            index=flow.index,
            total=flow.total,
            payload=encode_value(result, job, app.broker.max_result_size),
            ttl=_ttl(app, callback.task),
            callback=callback.message((), then),
        )
    return FlowStep(job.delivery, tuple(results), publish, chord, flow.forget)


def _passed(job: Job, app: Hurtle, result: Any, link: Link, flow: Flow) -> Message:
    """The message of ``link`` with ``result`` put first, carrying ``flow``. An encrypted
    task's result goes on sealed, whatever the next task."""
    keyring = job.task.keyring
    if keyring is not None and not (link.headers and SEALED in link.headers):
        return keyring.seal_message(link.message((result,), flow))
    return link.message((result,), flow, app.keyring)


def _opened(record: Record, app: Hurtle) -> Any:
    """The value of a chord member's record, opened if it is sealed."""
    value = record.value
    if not is_sealed(value):
        return value
    if app.keyring is None:
        raise no_keys(f"result of task {record.task}")
    return app.keyring.open_value(record.task, value)


def prepare_header(job: Job) -> Flow:
    flow = job.flow = read_flow(job.message)
    return flow
