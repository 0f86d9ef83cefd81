"""Text of user objects (exceptions, arguments, functions) that never raises."""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from typing import Any


def safe_str(value: object) -> str:
    """``str(value)``, or a placeholder when that raises (user objects may do anything)."""
    try:
        text = str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if isinstance(text, str) else f"<unprintable {type(value).__name__}>"


def safe_repr(value: object) -> str:
    """``repr(value)``, or a placeholder when that raises."""
    try:
        return repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def describe(err: BaseException) -> str:
    """``TypeName: message`` for an exception, even one whose ``__str__`` raises."""
    return f"{type(err).__name__}: {safe_str(err)}"


def trace(err: BaseException) -> str:
    """The formatted traceback of ``err`` (its description if that fails)."""
    try:
        return "".join(traceback.format_exception(err))
    except Exception:
        return describe(err)


def signature(fn: Callable[..., Any]) -> str:
    """``(x, y)``: the signature of ``fn``, or ``(...)`` when it has none to show."""
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
