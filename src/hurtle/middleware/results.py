"""Results, worker side: the record of each outcome of a ``store_result`` task.

What a record holds, encoded with msgspec msgpack (never pickle), and when it is written:

* ``succeeded`` — the task returned; the record holds the value. Encoded for a whole batch of
  returned calls at once (``after_calls``) and written with the messages' acknowledgements, in
  the same broker call (``Acker.ack_many_with_results``). A value msgpack cannot
  encode fails the call instead (``ResultError`` naming the type), which is then retried or
  dead-lettered like any failure;
* ``failed`` — an attempt failed and another is scheduled; the record holds the error's type
  name, message and traceback text. The next attempt's record replaces it;
* ``dead`` — the message failed for good (no retries left, rejected, time limit, arguments that
  do not fit): the same fields, so a waiter raises at once rather than at its timeout.

``pending`` (no record) is what a handle reports before any of these. There is no ``running``
record: writing one for every message on fetch would double the result writes of each batch,
for a state that a waiter cannot act on; a message being run reads as ``pending``.

The handle side (``hurtle.handles``) decodes what this module encodes. Records are kept
``result_ttl`` seconds (the task's, else the app's setting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from .._text import safe_str, trace
from ..brokers import StoredResult
from ..errors import ResultError
from . import Calls, Middleware, Outcome

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..task import Task
    from ..worker.acker import Acker
    from ..worker.processor import Job
    from ..worker.worker import Worker

PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
DEAD = "dead"
#: Every state ``Handle.state`` may return.
STATES = (PENDING, RUNNING, SUCCEEDED, FAILED, DEAD)


class Record(msgspec.Struct, array_like=True, omit_defaults=True):
    """One stored outcome; ``value`` on success, the error's fields otherwise."""

    state: str
    value: Any = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""


_encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(Record)


def encode_value(value: Any, job: Job) -> bytes:
    """The ``succeeded`` record of ``value``; ``ResultError`` when msgpack cannot encode it."""
    try:
        return _encode((SUCCEEDED, value))  # the bytes of Record(SUCCEEDED, value), made faster
    except (TypeError, ValueError, OverflowError) as err:
        raise unstorable(value, job.task.name, job.message.id, err) from err


def unstorable(value: Any, task: str, message_id: str, err: Exception) -> ResultError:
    """The error that fails a call whose return value msgpack cannot encode."""
    return ResultError(
        f"task {task}[{message_id}] returned a value of type {type(value).__name__} "
        f"that cannot be stored as its result ({err}); return something msgpack can "
        f"encode (None, bool, int, float, str, bytes, lists, dicts, msgspec Structs, "
        f"dataclasses, datetimes), or set store_result=False on {task}"
    )


def encode_failure(state: str, error: BaseException) -> bytes:
    """A ``failed`` or ``dead`` record of ``error``."""
    return _encode(
        Record(
            state,
            error_type=type(error).__name__,
            error_message=safe_str(error),
            traceback=trace(error),
        )
    )


def decode(payload: bytes) -> Record:
    return _decoder.decode(payload)


class Results(Middleware):
    """Stores the outcomes of the tasks that keep results (``store_result``); one per worker."""

    def __init__(self, app: Hurtle) -> None:
        self.app = app
        self.acker: Acker | None = None

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.store_result

    def worker_start(self, worker: Worker) -> None:
        self.acker = worker.acker

    def after_calls(self, calls: Calls) -> None:
        # one comprehension per batch: the encodes, and no hook call per task
        ttl = calls.task.result_ttl
        try:
            payloads = [_encode((SUCCEEDED, value)) for value in calls.results]
        except (TypeError, ValueError, OverflowError):
            payloads = [self._payload(calls, i) for i in range(len(calls))]
        calls.stored = [
            StoredResult(m.id, p, ttl) for m, p in zip(calls.messages, payloads, strict=True)
        ]

    @staticmethod
    def _payload(calls: Calls, i: int) -> bytes:
        """Call ``i``'s record, or ``b""`` after failing it (a value msgpack cannot encode)."""
        value = calls.results[i]
        try:
            return _encode((SUCCEEDED, value))  # the bytes of Record(SUCCEEDED, value)
        except (TypeError, ValueError, OverflowError) as err:
            failure = unstorable(value, calls.task.name, calls.messages[i].id, err)
            failure.__cause__ = err
            calls.fail(i, failure)
            return b""

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        if outcome.kind in ("retry", "dead") and outcome.error is not None:
            assert self.acker is not None, "worker_start was not called"
            state = FAILED if outcome.kind == "retry" else DEAD
            self.acker.store_result(
                job.message.id, encode_failure(state, outcome.error), job.task.result_ttl
            )
