"""A running task's progress report: how far it got (a fraction from 0 to 1) and a line of
text, as ``hurtle.current().progress(0.4, "resized 4 of 10")`` reports it and ``Handle.progress``
reads it back.

A value type, like ``records``: encoded with msgspec msgpack, knowing nothing of brokers or
workers. The worker keeps the latest report of each running task in memory (on its
``hurtle.current()`` context) and writes the reports of all its tasks in one broker call at
most every ``INTERVAL`` seconds (``worker.tracker``), so a task that reports in a tight loop
costs no more than one that reports once a second. Brokers store the bytes under the message
id for ``PROGRESS_TTL`` seconds (``Broker.put_progress``), apart from the result record: a
report never replaces a result, nor a result a report.
"""

from __future__ import annotations

import math

import msgspec

from .errors import ConfigurationError

#: Seconds between two writes of a worker's progress reports: the latest report of each task
#: is written at the next one, whether the task still runs or ended meanwhile.
INTERVAL = 0.5
#: Seconds a progress report is kept after it was written.
PROGRESS_TTL = 86400.0
#: The longest message kept: a report's text is cut there.
MAX_MESSAGE = 1000


class Progress(msgspec.Struct, array_like=True, frozen=True):
    """A task's latest progress report: ``fraction`` done (0 to 1), its ``message``, and when
    the worker wrote it (``at``, Unix seconds: at most an interval, ``INTERVAL``, after the
    report, which reads no clock)."""

    fraction: float
    message: str = ""
    at: float = 0.0


_encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(Progress)


def check_progress(fraction: object, message: object) -> tuple[float, str]:
    """A report's fraction and message, checked: a number from 0 to 1 and a str (cut to
    ``MAX_MESSAGE`` characters); else a ``ConfigurationError`` naming the value."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not math.isfinite(fraction)
        or not 0 <= fraction <= 1
    ):
        raise ConfigurationError(
            f"progress must be a fraction from 0 to 1 (0.4 for 40 %), got {fraction!r:.60}"
        )
    if not isinstance(message, str):
        raise ConfigurationError(
            f"a progress message must be a str, got {type(message).__name__} {message!r:.60}"
        )
    return float(fraction), message[:MAX_MESSAGE]


def encode_progress(progress: Progress) -> bytes:
    return _encode(progress)


def decode_progress(payload: bytes | None) -> Progress | None:
    """The report stored as ``payload``; None for none, or for bytes that are not one."""
    if payload is None:
        return None
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError:
        return None
