"""Per-call options of a send (``SendOptions``: queue, delay, eta, priority, headers, expires)
and the checks of a task's options: each checked once, when given, never per message.

``Task.options`` lists the per-call options; ``same_options`` gives another ``options`` method
(a signature's) the same parameters for type checkers, so the list is written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec

from .errors import ConfigurationError
from .message import priority_problem, seconds_problem
from .names import QUEUE_NAME_RULE, queue_name_problem

T = TypeVar("T")
S = TypeVar("S")
OP = ParamSpec("OP")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SendOptions:
    """Per-call options; ``None`` means the task's own setting."""

    queue: str | None = None
    delay: float | None = None
    eta: float | None = None
    priority: int | None = None
    headers: Mapping[str, Any] | None = None
    #: Seconds from the send after which the message is no longer started.
    expires: float | None = None

    def __post_init__(self) -> None:  # checked once per options, never per message
        problem = None
        if self.queue is not None:
            problem = queue_name_problem(self.queue)
            if problem is not None:
                problem = f"{problem}; {QUEUE_NAME_RULE}"
        if problem is None and self.priority is not None:
            problem = priority_problem(self.priority)
        if problem is None and self.headers is not None:
            problem = headers_problem(self.headers)
        if problem is None and self.delay is not None:
            problem = seconds_problem(self.delay, "delay")
        if problem is None and self.eta is not None:
            problem = seconds_problem(self.eta, "eta", "a Unix time in seconds (time.time() + s)")
        if problem is None and self.expires is not None:
            problem = seconds_problem(self.expires, "expires")
        if problem is not None:
            raise ConfigurationError(problem)


def same_options(
    source: Callable[Concatenate[Any, OP], object],
) -> Callable[[Callable[Concatenate[S, ...], T]], Callable[Concatenate[S, OP], T]]:
    """Give a method the keyword parameters of ``source`` (``Task.options``) for type checkers,
    so that every ``options`` method takes the same options, listed once."""

    def same(method: Callable[Concatenate[S, ...], T]) -> Callable[Concatenate[S, OP], T]:
        return method

    return same


def headers_problem(headers: object) -> str | None:
    """What is wrong with ``headers=`` (a dict of str keys to values msgspec can encode), or
    None."""
    if not isinstance(headers, Mapping):
        return f"headers must be a dict of str keys, got {type(headers).__name__}: {headers!r:.60}"
    for key in headers:
        if not isinstance(key, str):
            return f"headers must have str keys, got the key {key!r:.60} ({type(key).__name__})"
    try:
        msgspec.msgpack.encode(dict(headers))
    except (TypeError, ValueError, OverflowError, RecursionError) as err:
        return f"headers cannot be encoded ({err}): give plain values (str, int, float, ...)"
    return None


def checked(task: str, check: Callable[[Any], T], value: object) -> T:
    """``check(value)``, its ``ConfigurationError`` naming ``task``."""
    try:
        return check(value)
    except ConfigurationError as err:
        raise ConfigurationError(f"task {task!r}: {err}") from None


def check_priority(task: str, priority: object) -> int:
    problem = priority_problem(priority)
    if problem is not None:
        raise ConfigurationError(f"task {task!r}: {problem}")
    return priority  # type: ignore[return-value]


def check_seconds(task: str, value: object, what: str, unit: str = "a number of seconds") -> None:
    problem = seconds_problem(value, what, unit)
    if problem is not None:
        raise ConfigurationError(f"task {task!r}: {problem}")
