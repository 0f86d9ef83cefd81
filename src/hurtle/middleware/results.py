"""Results, worker side: the record of each outcome of a ``store_result`` task.

What a record holds, encoded with msgspec msgpack (never pickle), and when it is written:

* ``succeeded`` — the task returned; the record holds the value. Made for a whole batch of
  returned calls at once (``after_calls``) and written with the messages' acknowledgements, in
  the same broker call (``Acker.ack_many_with_results``). Where the broker keeps batches whole
  (``Broker.result_batches``: Redis), a batch of ``BATCHED_FROM`` calls or more is one encode
  of one value (``Batch``: the values, run times and the messages' own bytes), and a call's
  record is made from it when it is read (``record_in_batch``); otherwise one record per call.
  A value msgpack cannot encode fails the call instead (``ResultError`` naming the type), which
  is then retried or dead-lettered like any failure;
* ``failed`` — an attempt failed and another is scheduled; the record holds the error's type
  name, message and traceback text. The next attempt's record replaces it;
* ``dead`` — the message became a dead letter: it failed for good (no retries left, rejected,
  time limit, arguments that do not fit: the same fields), or did not run (undecodable, of a
  task the worker does not know, its handling crashed, its workers kept dying: the reason as
  the message), so a waiter raises at once rather than at its timeout;
* ``expired`` / ``cancelled`` — the message was not run: its expiry time passed before it
  started, or it was cancelled (``Hurtle.cancel``), and a waiter raises ``TaskFailed`` at once.

The records of dead letters are written, whatever the road to them, where the worker decides
that a message is dead (``worker.ends``, with its workflow's record and its unique lock), or by
the broker when it dead-letters a message itself (``brokers.common.dead_ends``).

Each record also says what ran and when, for task lookups (the dashboard's ``/api/tasks/{id}``):
the task and queue, the attempt, the arguments when the message was at most ``ARGS_KEPT_UP_TO``
bytes (larger ones are not copied into every record; ``args_kept`` says which), and the wall
times it was enqueued, started and finished (the call's monotonic run time, set back from one
``time.time()`` read when the record is made). Records written before these fields existed
decode with them empty.

``pending`` (no record) is what a handle reports before any of these. There is no ``running``
record: writing one for every message on fetch would double the result writes of each batch,
for a state that a waiter cannot act on; a message being run reads as ``pending``.

The record's format — its states, ``Record``, ``Batch`` — is ``hurtle.records``, below the
brokers; this module decides what goes in a record and when it is written, and the handle side
(``hurtle.handles``) decodes it. Records are kept
``result_ttl`` seconds (the task's, else the app's setting).
"""

from __future__ import annotations

import contextlib
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from .._text import safe_str, trace
from ..brokers import ResultBatch, StoredResults
from ..brokers.base import MAX_SIZE
from ..errors import ResultError
from ..records import FAILED, SUCCEEDED, Record, records_in_batch, succeeded
from . import Calls, Job, Middleware, Outbox, Outcome, WorkerParts

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..message import Message
    from ..sealing import Keyring
    from ..task import Task

#: Messages up to this many bytes have their arguments copied into their records.
ARGS_KEPT_UP_TO = 4096
#: A batch of at least this many returned calls is stored as one value (``Batch``) where the
#: broker keeps batches whole; a smaller one, as one record per call.
BATCHED_FROM = 32
#: ... and is cut in parts of at most this many calls, each stored as one ``Batch``: a reader
#: of one record gets its part (about 5 KB for short calls), not the whole batch. Smaller parts
#: make more of them for a reader to look through (Redis: 64 read fastest, 32 and 128 slower).
BATCH_MOST = 64

_encode = msgspec.msgpack.Encoder().encode
#: What msgspec raises on a value it cannot encode (a type it does not know, an int too big,
#: lists or dicts nested too deeply).
UNENCODABLE = (TypeError, ValueError, OverflowError, RecursionError)


def _about(job: Job) -> tuple[Any, ...]:
    """The fields of a record after the error's: what ran, and when (wall-clock seconds)."""
    started = finished = 0.0
    if job.started:
        finished = time.time()
        if job.finished >= job.started:
            started = finished - (job.finished - job.started)
    return about(job.task.name, job.message, len(job.delivery.raw), started, finished)


def about(task: str, m: Message, size: int, started: float, finished: float) -> tuple[Any, ...]:
    """A record's fields after the error's for a call of ``task`` on ``m`` (``size`` bytes as
    delivered: its arguments are kept up to ``ARGS_KEPT_UP_TO``), run from ``started`` to
    ``finished`` (wall-clock seconds)."""
    kept = size <= ARGS_KEPT_UP_TO
    return (
        task,
        m.queue,
        m.attempt,
        kept,
        m.args if kept else (),
        m.kwargs if kept else {},
        m.created,
        started,
        finished,
    )


def encode_value(value: Any, job: Job, most: int = MAX_SIZE) -> bytes:
    """The ``succeeded`` record of ``value`` (sealed if its task is encrypted); ``ResultError``
    when msgpack cannot encode it, or when the record is over ``most`` bytes
    (``Broker.max_result_size``)."""
    return succeeded_record(value, job.task, job.message, _about(job), most)


def succeeded_record(
    value: Any, task: Task[Any, Any], message: Message, about: tuple[Any, ...], most: int
) -> bytes:
    """``encode_value`` for a call without a ``Job`` (a workflow's on the batch path,
    ``worker.flowcalls``): ``about`` is what ``_about`` reads from a job."""
    keyring = task.keyring
    try:
        stored = value if keyring is None else keyring.seal_value(task.name, value)
        # the bytes of Record(SUCCEEDED, value, ...), made faster
        record = _encode((SUCCEEDED, stored, "", "", "", *about))
    except UNENCODABLE as err:
        raise unstorable(value, task.name, message.id, err) from err
    if len(record) > most:
        raise too_large(value, task.name, message.id, len(record), most)
    return record


def too_large(value: Any, task: str, message_id: str, size: int, most: int) -> ResultError:
    """The error that fails a call whose result record is over the broker's size limit."""
    return ResultError(
        f"task {task}[{message_id}] returned a value of type {type(value).__name__} whose "
        f"result record is {size:,} bytes, over the {most:,} bytes its broker stores in one "
        f"(Broker.max_result_size); store large data elsewhere and return a reference to it "
        f"(a path, a URL, a key), or set store_result=False on {task}"
    )


def unstorable(value: Any, task: str, message_id: str, err: Exception) -> ResultError:
    """The error that fails a call whose return value msgpack cannot encode."""
    if isinstance(err, RecursionError):
        return ResultError(
            f"task {task}[{message_id}] returned a value of type {type(value).__name__} "
            f"nested too deeply to be stored as its result ({err}); return it flatter, or "
            f"set store_result=False on {task}"
        )
    return ResultError(
        f"task {task}[{message_id}] returned a value of type {type(value).__name__} "
        f"that cannot be stored as its result ({err}); return something msgpack can "
        f"encode (None, bool, int, float, str, bytes, lists, dicts, msgspec Structs, "
        f"dataclasses, datetimes), or set store_result=False on {task}"
    )


def encode_failure(
    state: str, error: BaseException, job: Job | None = None, most: int = MAX_SIZE
) -> bytes:
    """A ``failed`` or ``dead`` record of ``error`` (with what ran and when, given the job),
    in at most ``most`` bytes: the error's text and traceback are cut to fit if need be."""
    fields = (state, None, type(error).__name__, safe_str(error), trace(error))
    if job is not None:
        try:
            record = _encode((*fields, *_about(job)))
        except UNENCODABLE:
            pass  # arguments msgpack cannot encode (a message from elsewhere): leave them out
        else:
            if len(record) <= most:
                return record
    record = _encode(Record(*fields))
    if len(record) <= most:
        return record
    keep = max(most // 3, 64)
    return _encode(Record(state, None, fields[2], fields[3][:keep], fields[4][-keep:]))


def _sealed(calls: Calls, keyring: Keyring) -> list[Any] | None:
    """The calls' return values sealed, or None when one cannot be encoded."""
    seal, task = keyring.seal_value, calls.task.name
    try:
        return [seal(task, value) for value in calls.results]
    except UNENCODABLE:
        return None


def _seal_or_fail(calls: Calls, i: int, keyring: Keyring | None) -> Any:
    """Call ``i``'s value sealed, or None after failing the call (it cannot be encoded)."""
    assert keyring is not None
    value = calls.results[i]
    try:
        return keyring.seal_value(calls.task.name, value)
    except UNENCODABLE as err:
        failure = unstorable(value, calls.task.name, calls.messages[i].id, err)
        failure.__cause__ = err
        calls.fail(i, failure)
        return None


class Results(Middleware):
    """Stores the outcomes of the tasks that keep results (``store_result``); one per worker."""

    def __init__(self, app: Hurtle) -> None:
        self.app = app
        self.acker: Outbox | None = None
        #: Whether the broker keeps a batch's records whole (``Broker.result_batches``).
        self.whole = False
        #: The most bytes of a record (``Broker.max_result_size``): a larger one fails its call.
        self.most = MAX_SIZE

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.store_result

    def worker_start(self, worker: WorkerParts) -> None:
        self.acker = worker.acker
        self.whole = self.app.broker.result_batches
        self.most = self.app.broker.max_result_size

    def after_calls(self, calls: Calls) -> None:
        # per batch: one encode of the whole batch where the broker keeps batches whole, else
        # one comprehension of encodes; no hook call per task. A call's record says it
        # finished when its batch's results were made (one clock read per batch) and started
        # its run time before that.
        ttl = calls.task.result_ttl
        task = calls.task.name
        now = time.time()
        ids = [m.id for m in calls.messages]
        values: list[Any] | None = calls.results
        keyring = calls.task.keyring
        if keyring is not None:  # an encrypted task's: stored sealed, one seal per call
            values = _sealed(calls, keyring)
        if self.whole and len(ids) >= BATCHED_FROM and values is not None:
            raws = [d.raw for d in calls.deliveries]
            if max(map(len, raws)) <= ARGS_KEPT_UP_TO:
                runtimes, most = calls.runtimes, BATCH_MOST
                bodies: list[bytes] = []
                # a value msgpack cannot encode: found and failed one by one below
                with contextlib.suppress(*UNENCODABLE):
                    # the bytes of Batch(task, now, values, runtimes, messages), per part of
                    # at most BATCH_MOST calls
                    bodies = [
                        _encode(
                            (
                                task,
                                now,
                                values[i : i + most],
                                runtimes[i : i + most],
                                raws[i : i + most],
                            )
                        )
                        for i in range(0, len(ids), most)
                    ]
                if bodies and max(map(len, bodies)) <= self.most:  # else one by one below
                    # one by one only if a broker asks (not one that keeps them whole),
                    # from the body: the batch's messages are not kept alive until then
                    batches = [
                        ResultBatch(
                            min(most, len(ids) - i * most), body, partial(records_in_batch, body)
                        )
                        for i, body in enumerate(bodies)
                    ]
                    calls.stored = StoredResults(ids, None, ttl, batches)
                    return
        if values is None:  # a value that could not be sealed: its call failed
            values = [_seal_or_fail(calls, i, keyring) for i in range(len(calls))]
        try:
            kept = [len(d.raw) <= ARGS_KEPT_UP_TO for d in calls.deliveries]
            payloads = succeeded(task, now, values, calls.messages, calls.runtimes, kept)
        except UNENCODABLE:
            payloads = [self._payload(calls, i, now, values) for i in range(len(calls))]
        if payloads and max(map(len, payloads)) > self.most:  # one pass in C per part
            self._too_large(calls, payloads)
        calls.stored = StoredResults(ids, payloads, ttl)

    def _too_large(self, calls: Calls, payloads: list[bytes]) -> None:
        """Fail the calls whose records are over the broker's size limit."""
        for i, payload in enumerate(payloads):
            if len(payload) > self.most:
                m = calls.messages[i]
                failure = too_large(
                    calls.results[i], calls.task.name, m.id, len(payload), self.most
                )
                calls.fail(i, failure)
                payloads[i] = b""

    @staticmethod
    def _payload(calls: Calls, i: int, now: float, values: list[Any]) -> bytes:
        """Call ``i``'s record, or ``b""`` after failing it (a value msgpack cannot encode)."""
        if i in calls.failures:
            return b""
        value, m = values[i], calls.messages[i]
        kept = len(calls.deliveries[i].raw) <= ARGS_KEPT_UP_TO
        about = (calls.task.name, m.queue, m.attempt, kept)
        when = (m.created, now - calls.runtimes[i], now)
        try:
            try:
                args = (m.args, m.kwargs) if kept else ((), {})
                return _encode((SUCCEEDED, value, "", "", "", *about, *args, *when))
            except UNENCODABLE:  # the arguments, perhaps
                return _encode((SUCCEEDED, value, "", "", "", *about[:3], False, (), {}, *when))
        except UNENCODABLE as err:
            failure = unstorable(calls.results[i], calls.task.name, m.id, err)
            failure.__cause__ = err
            calls.fail(i, failure)
            return b""

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        # a dead letter's record is written where the worker decides it (``worker.ends``),
        # whatever the road to it
        if outcome.kind == "retry" and outcome.error is not None:
            assert self.acker is not None, "worker_start was not called"
            record = encode_failure(FAILED, outcome.error, job, self.most)
            self.acker.store_result(job.message.id, record, job.task.result_ttl)
