"""What a number of seconds may be — a delay, a ttl, a Unix time: the one check, worded for
error messages. It sits below every other module (``errors`` uses it for ``Retry(delay=)``)."""

from __future__ import annotations

import math
import sys

_MAX_FLOAT = sys.float_info.max


def seconds_problem(value: object, what: str, unit: str = "a number of seconds") -> str | None:
    """What is wrong with ``value`` as ``what`` (a delay, an eta...), or None: a finite int or
    float (not a bool) >= 0."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return f"{what} must be {unit}, got {value!r} ({type(value).__name__})"
    try:
        finite = math.isfinite(value) and float(value) <= _MAX_FLOAT
    except OverflowError:  # an int beyond any float, such as 10**400
        finite = False
    if not finite:
        shown = repr(value) if len(repr(value)) <= 40 else f"{str(value)[:20]}... (an int)"
        return f"{what} must be a finite number, got {shown}"
    if value < 0:
        return f"{what} must be >= 0, got {value!r}"
    return None
