"""A result record: the states a call's outcome may be in, and the bytes a broker stores for
it — one ``Record``, or a ``Batch`` of one task's returned calls from which a call's record is
made when it is read (``record_in_batch``).

A value type, like ``Message``: encoded with msgspec msgpack (never pickle), and knowing nothing
of brokers, workers or handles. The worker writes these records (``middleware.results``, and
``worker.ends`` for dead letters), a broker that dead-letters a message itself writes its
``dead`` record (``member_record``, ``brokers.common.dead_ends``), a broker that keeps batches
whole cuts a call's record from its batch, and handles and the dashboard read them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from ._text import safe_str, trace
from .message import Message

PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
DEAD = "dead"
EXPIRED = "expired"
CANCELLED = "cancelled"
#: A debounced call that a later call of its key replaced (``hurtle.debounce``): not run.
SUPERSEDED = "superseded"
#: Every state ``Handle.state`` may return.
STATES = (PENDING, RUNNING, SUCCEEDED, FAILED, DEAD, EXPIRED, CANCELLED, SUPERSEDED)
#: The states after which nothing more happens to a message.
FINAL = frozenset((SUCCEEDED, DEAD, EXPIRED, CANCELLED, SUPERSEDED))


class Record(msgspec.Struct, array_like=True, omit_defaults=True):
    """One stored outcome; ``value`` on success, the error's fields otherwise; then what ran
    and when (0 and empty when unknown: records of older versions)."""

    state: str
    value: Any = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    task: str = ""
    queue: str = ""
    attempt: int = 0
    args_kept: bool = False
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    enqueued: float = 0.0
    started: float = 0.0
    finished: float = 0.0


_encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(Record)


def dead_kind(state: str) -> str:
    """``TaskFailed.type`` of a message that ended without an exception of its own:
    ``Expired``, ``Cancelled``, else ``DeadLetter``."""
    return "DeadLetter" if state == DEAD else state.capitalize()


def encode_skipped(state: str, why: str, message: Message) -> bytes:
    """The record of a message that ended without an exception of its own: not run
    (``expired``, ``cancelled``), or ``dead`` (undecodable, of an unknown task, lost)."""
    return _encode(
        Record(
            state,
            error_type=dead_kind(state),
            error_message=why,
            task=message.task,
            queue=message.queue,
            attempt=message.attempt,
            enqueued=message.created,
            finished=time.time(),
        )
    )


def encode_superseded(message: Message, by: str, key: str) -> bytes:
    """The record of a debounced call that the later call ``by`` of its ``key`` replaced: its
    ``value`` is ``by``'s id (``Handle.result`` raises ``Superseded`` naming it)."""
    return _encode(
        Record(
            SUPERSEDED,
            value=by,
            error_type="Superseded",
            error_message=f"superseded by the later call {by} of its debounce key {key!r}",
            task=message.task,
            queue=message.queue,
            attempt=message.attempt,
            enqueued=message.created,
            finished=time.time(),
        )
    )


def decode(payload: bytes) -> Record:
    return _decoder.decode(payload)


class Batch(msgspec.Struct, array_like=True):
    """The succeeded records of one batch of calls of one task, as one value: what a broker
    that keeps batches whole (``Broker.result_batches``) stores. Per call its value, run time
    and message (the bytes it was delivered as), from which ``record_in_batch`` makes the
    call's ``Record``; ``finished`` is when the batch's records were made."""

    task: str
    finished: float
    values: list[msgspec.Raw]
    runtimes: list[float]
    messages: list[bytes]


_batch_decoder = msgspec.msgpack.Decoder(Batch)


def record_in_batch(body: bytes | memoryview, k: int) -> bytes:
    """The ``succeeded`` record of call ``k`` of the ``Batch`` in ``body``: the same bytes as
    the record stored on its own would be."""
    return _record(_batch_decoder.decode(body), k)


def records_in_batch(body: bytes) -> list[bytes]:
    """The records of every call of the ``Batch`` in ``body``, one by one."""
    batch = _batch_decoder.decode(body)
    return [_record(batch, k) for k in range(len(batch.values))]


def _record(batch: Batch, k: int) -> bytes:
    m = Message.decode(batch.messages[k])
    return succeeded(batch.task, batch.finished, (batch.values[k],), (m,), (batch.runtimes[k],))[0]


def succeeded(
    task: str,
    finished: float,
    values: Sequence[Any],
    messages: Sequence[Message],
    runtimes: Sequence[float],
    kept: Sequence[bool] | None = None,
) -> list[bytes]:
    """The ``succeeded`` records of calls of ``task`` that returned ``values`` (the bytes of
    ``Record(SUCCEEDED, value, ...)``, made faster: one comprehension of encodes), each
    ``finished`` at that time after running its run time. ``kept``: per call, whether its
    arguments are copied into its record (default: every call's). Raises what msgspec raises
    on a value it cannot encode."""
    if kept is None:
        kept = [True] * len(values)
    return [
        _encode(
            (
                SUCCEEDED,
                value,
                "",
                "",
                "",
                task,
                m.queue,
                m.attempt,
                k,
                m.args if k else (),
                m.kwargs if k else {},
                m.created,
                finished - ran,
                finished,
            )
        )
        for value, m, ran, k in zip(values, messages, runtimes, kept, strict=True)
    ]


def member_record(
    state: str, message: Message, error: BaseException | None, why: str, kind: str = ""
) -> bytes:
    """The record of a workflow one of whose messages became a dead letter: ``state`` (``dead``,
    ``expired``, ``cancelled``), naming the member (``[task, id]``) and why (``error``, else
    ``why`` with the type ``kind``, by default the state's: ``dead_kind``)."""
    if error is not None:
        kind, text, tb = type(error).__name__, safe_str(error), trace(error)
    else:
        kind, text, tb = kind or dead_kind(state), why, ""
    record = Record(
        state, value=[message.task, message.id], error_type=kind, error_message=text, traceback=tb
    )
    return _encode(record)
