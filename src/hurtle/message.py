"""The wire record of one task call: frozen, encoded once, and knowing nothing about brokers.

Messages are MessagePack arrays (msgspec), so a message can only ever name a registered task and
carry plain data: nothing that comes over the wire is unpickled.

The fields a broker and a worker trust are checked at both ends: ``check_messages`` (which every
broker's ``publish`` calls first) refuses a message whose priority is not an int from 0 to 9,
whose attempt is not an int >= 0, or whose eta, created or expiry time is not a finite number
>= 0, with an ``EncodeError`` naming the value; ``Message.decode`` refuses the same as a
``DecodeError`` (the worker dead-letters such bytes as undecodable). The decoder checks them in
the type itself, at no measurable cost.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from .errors import DecodeError, EncodeError
from .seconds import seconds_problem

#: Priorities run from 0 (the default, lowest) to 9 (highest).
MIN_PRIORITY = 0
MAX_PRIORITY = 9
_MAX_FLOAT = sys.float_info.max

Priority = Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
Attempt = Annotated[int, msgspec.Meta(ge=0)]
#: A Unix time in seconds: finite and >= 0 (NaN and infinity fail both bounds).
Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=_MAX_FLOAT)]
#: An expiry time: the int 0 (none, one byte on the wire, where a float takes nine) or a
#: Timestamp.
Expiry = Annotated[int, msgspec.Meta(ge=0)] | Timestamp


class Message(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One call of one task.

    ``eta`` is a Unix time before which the message must not run (0 means now); ``attempt`` counts
    earlier attempts, so the first run sees 0. ``expires`` is a Unix time after which a worker
    no longer starts it (0 means never): it becomes a dead letter with the reason ``expired``.

    ``unique`` names the lock a call of a ``unique_for`` task holds ("" for none) and
    ``unique_until`` when that lock ends at the latest (the sender's ``created`` plus
    ``unique_for``; 0 for none). They are fields, not headers, so that a worker reads them
    typed, with no dict to decode per message; a message without them costs two bytes.
    Messages from senders older than these fields name their lock in
    ``headers["unique"]`` and ``headers["unique_until"]``, which are still read (``lock_of``).
    Fields added at the end keep the format readable both ways: a decoder ignores the
    trailing fields it does not know, and gives the ones it misses their defaults.
    """

    id: str
    task: str
    queue: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    attempt: Attempt = 0
    priority: Priority = 0
    eta: Timestamp = 0.0
    created: Timestamp = 0.0
    headers: dict[str, Any] = {}
    expires: Expiry = 0
    unique: str = ""
    unique_until: Expiry = 0

    def encode(self) -> bytes:
        """The MessagePack bytes of this message; raises ``EncodeError`` naming the bad type."""
        try:
            return _encoder.encode(self)
        except (TypeError, ValueError, OverflowError, RecursionError) as err:
            raise EncodeError(_encode_failure(self.task, err)) from err

    @staticmethod
    def decode(raw: bytes) -> Message:
        """Rebuild a message from broker bytes; raises ``DecodeError`` when they are not one."""
        try:
            return _decoder.decode(raw)
        except msgspec.ValidationError as err:
            raise DecodeError(
                f"not a valid hurtle message ({len(raw)} bytes): {_invalid_field(raw, err)}"
            ) from err
        except (msgspec.DecodeError, TypeError, ValueError) as err:
            raise DecodeError(f"not a hurtle message ({len(raw)} bytes): {err}") from err
        except RecursionError as err:
            raise DecodeError(
                f"not a hurtle message ({len(raw)} bytes): nested too deeply to decode ({err})"
            ) from err

    @property
    def is_delayed(self) -> bool:
        return self.eta > time.time()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


class _Id(msgspec.Struct, array_like=True, gc=False):
    id: str


_id_decoder = msgspec.msgpack.Decoder(_Id)


def message_id(raw: bytes) -> str:
    """The id of the message in ``raw`` without decoding the rest, or ``""`` when the bytes
    are not a message."""
    try:
        return _id_decoder.decode(raw).id
    except Exception:
        return ""


class _Loose(msgspec.Struct, array_like=True, gc=False):
    """A message's fields read without their checks (``salvage``)."""

    id: str
    task: str
    queue: str
    args: Any = ()
    kwargs: Any = None
    attempt: Any = 0
    priority: Any = 0
    eta: Any = 0
    created: Any = 0
    headers: Any = None
    expires: Any = 0
    unique: Any = ""
    unique_until: Any = 0


_loose_decoder = msgspec.msgpack.Decoder(_Loose)


def salvage(raw: bytes) -> Message | None:
    """What can still be read of bytes that ``Message.decode`` refuses — the id, task, queue,
    headers and unique lock of a message with a bad field — as a ``Message`` (its other fields
    at their defaults), or None when not even those can: what a dead letter of such bytes
    still ends (its result record, its workflow, its lock)."""
    try:
        m = _loose_decoder.decode(raw)
    except Exception:
        return None
    if not m.id:
        return None
    until = m.unique_until
    if type(until) not in (int, float) or not 0 <= until <= _MAX_FLOAT:
        until = 0
    return Message(
        id=m.id,
        task=m.task,
        queue=m.queue,
        headers=m.headers if isinstance(m.headers, dict) else {},
        unique=m.unique if isinstance(m.unique, str) else "",
        unique_until=until,
    )


#: Decode without wrapping errors, for hot loops that fall back to ``Message.decode`` (and its
#: clear ``DecodeError``) on any exception.
decode_unchecked = _decoder.decode

_FIELDS = Message.__struct_fields__
_AT_INDEX = re.compile(r"at `\$\[(\d+)\]`")


def priority_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a priority, or None: an int (not a bool) from 0 to 9."""
    if not isinstance(value, int) or isinstance(value, bool):
        return (
            f"priority must be an int from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value!r} "
            f"({type(value).__name__})"
        )
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        return (
            f"priority {value!r} is out of range: use an int from {MIN_PRIORITY} (the default) "
            f"to {MAX_PRIORITY} (first)"
        )
    return None


def message_problem(m: Message) -> str | None:
    """What is wrong with a message's checked fields (priority, attempt, eta, created,
    expires, unique, unique_until), or None."""
    problem = priority_problem(m.priority)
    if problem is None and (
        not isinstance(m.attempt, int) or isinstance(m.attempt, bool) or m.attempt < 0
    ):
        problem = f"attempt must be an int >= 0, got {m.attempt!r}"
    return (
        problem
        or seconds_problem(m.eta, "eta", "a Unix time in seconds")
        or seconds_problem(m.created, "created", "a Unix time in seconds")
        or seconds_problem(m.expires, "expires", "a Unix time in seconds")
        or (
            None
            if isinstance(m.unique, str)
            else f"unique must be a str (a lock's name), got {type(m.unique).__name__}"
        )
        or seconds_problem(m.unique_until, "unique_until", "a Unix time in seconds")
    )


class CheckedBatch(list[Message]):
    """Messages valid by construction: ``Task.send_many`` builds them from options it checked
    once for the whole call, so ``check_messages`` trusts them without a pass over the batch."""

    __slots__ = ()


_NUMBER_TYPES = frozenset((int, float))


def check_messages(messages: Sequence[Message]) -> None:
    """Raise ``EncodeError`` naming the first message whose checked fields are invalid.

    Every broker's ``publish`` calls this first, so one invalid message in a batch enqueues
    nothing, on every broker alike, with the same error.
    """
    if type(messages) is CheckedBatch:
        return
    numbers = _NUMBER_TYPES
    for m in messages:
        p, a, e, c, x, u = m.priority, m.attempt, m.eta, m.created, m.expires, m.unique_until
        if (
            type(p) is not int
            or not MIN_PRIORITY <= p <= MAX_PRIORITY
            or type(a) is not int
            or a < 0
            or type(e) not in numbers
            or not 0.0 <= e <= _MAX_FLOAT  # False for NaN, inf and 10**400
            or type(c) not in numbers
            or not 0.0 <= c <= _MAX_FLOAT
            or type(x) not in numbers
            or not 0.0 <= x <= _MAX_FLOAT
            or type(m.unique) is not str
            or type(u) not in numbers
            or not 0.0 <= u <= _MAX_FLOAT
        ):
            break
    else:
        return
    for m in messages:  # the slow path: name the first message that is wrong, and why
        problem = message_problem(m)
        if problem is not None:
            raise EncodeError(
                f"cannot publish message {m.id} of task {m.task!r}: {problem}; nothing was enqueued"
            )


def lock_of(m: Message) -> tuple[str, float] | None:
    """The unique lock ``m`` names and when it ends at the latest (0 when unknown), or None:
    its ``unique`` fields, else the headers that older senders named it in."""
    if m.unique:
        return m.unique, float(m.unique_until)
    headers = m.headers
    if not headers:
        return None
    key = headers.get("unique")
    if not isinstance(key, str) or not key:
        return None
    until = headers.get("unique_until")
    if (type(until) is float or type(until) is int) and math.isfinite(until) and until >= 0:
        return key, float(until)
    return key, 0.0


def encode_many(messages: list[Message], most: int) -> list[bytes]:
    """Encode a batch for a broker that stores messages of at most ``most`` bytes
    (``Broker.max_message_size``); the first message that fails, or is larger, raises
    ``EncodeError`` and nothing is kept."""
    encode = _encoder.encode
    try:
        payloads = [encode(m) for m in messages]
    except (TypeError, ValueError, OverflowError, RecursionError):
        for m in messages:
            m.encode()  # raises the EncodeError naming the task and the type
        raise
    if payloads and max(map(len, payloads)) > most:  # one pass in C per batch
        check_size(messages, payloads, most)
    return payloads


def check_size(messages: Sequence[Message], payloads: Sequence[bytes], most: int) -> None:
    """Raise ``EncodeError`` for the first of ``messages`` whose bytes are over ``most``."""
    if len(messages) == len(payloads) and max(map(len, payloads), default=0) <= most:
        return  # the usual case, in one pass at C speed
    for m, raw in zip(messages, payloads, strict=True):
        if len(raw) > most:
            raise EncodeError(
                f"a call of task {m.task!r} is {len(raw):,} bytes encoded, over the "
                f"{most:,} bytes its broker stores in one message (Broker.max_message_size); "
                "pass a reference to large data (a path, a URL, a key in your own store) "
                "rather than the data"
            )


def _encode_failure(task: str, err: BaseException) -> str:
    if isinstance(err, RecursionError):
        return (
            f"cannot encode the arguments of task {task!r}: they are nested too deeply ({err}); "
            "flatten them or pass a reference (an id, a path) instead"
        )
    return (
        f"cannot encode the arguments of task {task!r}: {err}; pass plain data "
        "(str, int, float, bool, None, bytes, list, tuple, dict, datetime, uuid, "
        "dataclasses) or encode the object yourself"
    )


def _invalid_field(raw: bytes, err: msgspec.ValidationError) -> str:
    """A field that failed validation, with its value when the bytes still show it."""
    match = _AT_INDEX.search(str(err))
    if match is None or int(match.group(1)) >= len(_FIELDS):
        return str(err)
    index = int(match.group(1))
    name = _FIELDS[index]
    try:
        fields = msgspec.msgpack.decode(raw)
        value = fields[index]
    except Exception:  # only to say more: the ValidationError is the answer
        return f"{name}: {err}"
    if name == "priority":
        problem = priority_problem(value)
    elif name == "attempt":
        problem = (
            None
            if isinstance(value, int) and value >= 0
            else (f"attempt {value!r} is not an int >= 0")
        )
    elif name in ("eta", "created", "expires"):
        problem = seconds_problem(value, name, "a Unix time in seconds")
    else:
        problem = None
    return problem or f"{name} {value!r}: {err}"
