"""Task options for limits and uniqueness: parsed and checked once, at registration.

``rate_limit="50/s"`` (also ``/m``, ``/h``): at most that many starts per period across every
worker that shares the broker; ``rate_limit_key=`` a callable of the task's arguments giving a
key, each key with a limit of its own; ``on_429=True`` (or a callable of the exception) makes
an exception that carries an HTTP 429 count as ``Throttle`` (``hurtle.adaptive``).
``concurrency_limit=N`` (``concurrency_key=`` likewise):
at most N running at once. ``unique_for=S`` seconds: while a message with the same task and
arguments (or the same ``unique_key=`` of them) is waiting or running, sending another enqueues
nothing and returns the id of the one waiting. The worker side is ``middleware/limits.py`` and
``middleware/unique.py``.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from .adaptive import http_429
from .errors import ConfigurationError, Throttle

if TYPE_CHECKING:
    from .options import TaskOptions

#: A key function: called with the task's own arguments, returns the key (made a str).
KeyFunction = Callable[..., Any]

_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(s|m|h)\s*")


def parse_rate(task: str, text: object) -> tuple[int, float]:
    """``"50/s"`` -> ``(50, 1.0)``: a whole number >= 1 of starts per second, minute or hour."""
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) < 1:
        raise ConfigurationError(
            f"task {task!r}: rate_limit must look like '50/s', '100/m' or '1000/h' (a whole "
            f"number >= 1 of starts per second, minute or hour), got {text!r}"
        )
    return int(match.group(1)), _PERIODS[match.group(2)]


class Limits:
    """The checked limit and uniqueness options of one task (``task.limits``)."""

    __slots__ = (
        "concurrency",
        "concurrency_key",
        "keyed",
        "name",
        "on_429",
        "rate",
        "rate_key",
        "rate_text",
        "unique_for",
        "unique_key",
    )

    def __init__(self, name: str, options: TaskOptions) -> None:
        rate_limit = options.get("rate_limit")
        concurrency_limit = options.get("concurrency_limit")
        unique_for = options.get("unique_for")
        self.name = name
        self.rate_text = rate_limit
        self.rate = None if rate_limit is None else parse_rate(name, rate_limit)
        self.rate_key = _key_function(
            name, "rate_limit_key", options.get("rate_limit_key"), "rate_limit", rate_limit
        )
        on_429 = options.get("on_429")
        if on_429 is not None and on_429 is not False:
            if on_429 is not True and not callable(on_429):
                raise ConfigurationError(
                    f"task {name!r}: on_429 must be True (an exception carrying an HTTP 429 "
                    f"throttles) or a callable of the exception returning True, a "
                    f"retry_after in seconds, or False/None, got {on_429!r}"
                )
            if rate_limit is None:
                raise ConfigurationError(f"task {name!r}: on_429 needs rate_limit as well")
        #: ``on_429``: True, a callable of a raised exception, or None.
        self.on_429: Callable[[Exception], object] | bool | None = on_429 or None
        if concurrency_limit is not None and (
            not isinstance(concurrency_limit, int)
            or isinstance(concurrency_limit, bool)
            or concurrency_limit < 1
        ):
            raise ConfigurationError(
                f"task {name!r}: concurrency_limit must be a whole number >= 1 (or None), got "
                f"{concurrency_limit!r}"
            )
        self.concurrency = concurrency_limit
        self.concurrency_key = _key_function(
            name,
            "concurrency_key",
            options.get("concurrency_key"),
            "concurrency_limit",
            concurrency_limit,
        )
        if unique_for is not None and (
            not isinstance(unique_for, int | float)
            or isinstance(unique_for, bool)
            or not 0 < unique_for <= sys.float_info.max  # False for NaN, inf and 10**400
        ):
            raise ConfigurationError(
                f"task {name!r}: unique_for must be a finite number of seconds > 0 (how long a "
                f"lock may be held at most), got {unique_for!r}"
            )
        self.unique_for = None if unique_for is None else float(unique_for)
        self.unique_key = _key_function(
            name, "unique_key", options.get("unique_key"), "unique_for", unique_for
        )
        #: A keyed hash for the default unique lock of a task whose arguments are sealed
        #: (``Keyring.digest``), set by the task: its locks then tell nothing of them.
        self.keyed: Callable[[bytes], str] | None = None

    def throttle_of(self, err: Exception) -> Throttle | None:
        """The ``Throttle`` that ``err`` counts as under ``on_429``, or None (a failure)."""
        on_429 = self.on_429
        if on_429 is None:
            return None
        if on_429 is True:
            return http_429(err)
        assert callable(on_429)
        try:
            said = on_429(err)
        except Exception:  # a predicate that fails cannot turn a failure into a throttle
            return None
        if said is None or said is False:
            return None
        if said is True:
            return Throttle(reason=f"on_429 of task {self.name} ({type(err).__name__})")
        try:
            return Throttle(said, f"on_429 of task {self.name} ({type(err).__name__})")  # type: ignore[arg-type]
        except ConfigurationError:  # not seconds: throttled all the same
            return Throttle(reason=f"on_429 of task {self.name} ({type(err).__name__})")

    def rate_key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The broker key of this call's rate limit."""
        if self.rate_key is None:
            return self.name
        return f"{self.name}:{self.rate_key(*args, **kwargs)}"

    def concurrency_key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The broker key of this call's concurrency limit."""
        if self.concurrency_key is None:
            return self.name
        return f"{self.name}:{self.concurrency_key(*args, **kwargs)}"

    def unique_key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The unique lock of this call: the task and its arguments (or its ``unique_key``)."""
        if self.unique_key is not None:
            return f"{self.name}:{self.unique_key(*args, **kwargs)}"
        data = _encode((args, sorted(kwargs.items()) if kwargs else ()))
        if self.keyed is not None:
            return f"{self.name}:{self.keyed(data)}"
        # short arguments are their own key; longer ones are hashed (128 bits)
        text = data.hex() if len(data) <= 16 else hashlib.blake2b(data, digest_size=16).hexdigest()
        return f"{self.name}:{text}"


_encode = msgspec.msgpack.Encoder().encode


def _key_function(
    task: str, what: str, fn: object, needs: str, given: object
) -> KeyFunction | None:
    if fn is None:
        return None
    if not callable(fn):
        raise ConfigurationError(
            f"task {task!r}: {what} must be a callable of the task's arguments returning a key "
            f"(lambda user_id, **_: f'user:{{user_id}}'), got {fn!r}"
        )
    if given is None:
        raise ConfigurationError(f"task {task!r}: {what} needs {needs} as well")
    return fn
