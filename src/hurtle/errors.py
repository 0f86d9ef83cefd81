"""The exception tree: every error hurtle raises is a ``HurtleError``.

Control-flow signals that a task may raise on purpose (``Retry``, ``Reject``, ``Throttle``) are
separate classes
so that they are never confused with failures.
"""

from __future__ import annotations

import sys

from .seconds import seconds_problem


class HurtleError(Exception):
    """Base class of every error raised by hurtle."""


class ConfigurationError(HurtleError):
    """A setting, a broker URL or an app path is wrong; the message says which and why."""


class EncodeError(HurtleError):
    """A task's arguments cannot be encoded; nothing was enqueued."""


class ArgumentError(HurtleError, TypeError):
    """A call's arguments do not fit its task's signature; nothing was enqueued."""


class DecodeError(HurtleError):
    """Bytes taken from a broker are not a hurtle message."""


class SealError(HurtleError):
    """Sealed arguments or a sealed result cannot be opened (a key this app does not have, or
    bytes tampered with), or a task that seals its arguments got them unsealed. A message whose
    arguments cannot be opened becomes a dead letter with this error's text as its reason."""


class UnknownTaskError(HurtleError):
    """A message names a task that this app does not register."""


class BrokerError(HurtleError):
    """The broker could not be reached or refused an operation."""


class TimeLimitExceeded(HurtleError):
    """A task ran longer than its ``time_limit``."""


class TaskCancelled(HurtleError):
    """Raised in a running task that ``Hurtle.cancel`` named, where its pool can interrupt it
    (the solo pool on a process's main thread: ``hurtle worker``, each ``--processes`` child).
    Elsewhere a task sees ``hurtle.current().cancelled`` turn true (and an ``async def`` task in
    the asyncio pool an ``asyncio.CancelledError``). Either way its outcome is ``cancelled``: a
    dead letter with that reason, and for a task that keeps results a handle whose ``result``
    raises ``TaskFailed`` with ``type`` ``Cancelled``."""


class TaskFailed(HurtleError):
    """The task of a result handle failed for good (``Handle.result``).

    ``type`` is the name of the exception the task raised, ``message`` its text and
    ``traceback`` the remote traceback, formatted.
    """

    def __init__(self, id: str, task: str, type: str, message: str, traceback: str) -> None:
        super().__init__(f"task {task}[{id}] failed: {type}: {message}")
        self.id = id
        self.task = task
        self.type = type
        self.message = message
        self.traceback = traceback


class Superseded(TaskFailed):
    """The call of a result handle was debounced away: a later call of its debounce key
    (``superseded_by``, its message id) replaced it, and it never ran
    (``@app.task(debounce=...)``). A ``TaskFailed`` of ``type`` ``Superseded``."""

    def __init__(self, id: str, task: str, message: str, superseded_by: str) -> None:
        super().__init__(id, task, "Superseded", message, "")
        self.superseded_by = superseded_by


class ResultError(HurtleError):
    """A task's result cannot be stored (its value cannot be encoded), or a handle cannot have
    one (its task does not keep results)."""


class ResultTimeout(HurtleError, TimeoutError):
    """No result arrived within the time a ``Handle.result`` call was given."""


class Retry(Exception):
    """Raised by a task to ask for another attempt, optionally after ``delay`` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and (
            type(delay) not in (int, float) or not 0 <= delay <= sys.float_info.max
        ):
            problem = seconds_problem(delay, "Retry(delay=...)")
            if problem is not None:
                raise ConfigurationError(
                    f"{problem}; pass seconds >= 0, or no delay for the task's backoff"
                )
        super().__init__(reason or "retry requested")
        self.delay = delay
        self.reason = reason


class Throttle(Exception):
    """Raised by a task when the service it calls says "too many requests" (an HTTP 429): the
    call is put back, due in ``retry_after`` seconds (about a second when None), without
    spending an attempt, and the task's rate limit, if it has one, is cut for every worker
    until the service recovers (``hurtle.adaptive``)."""

    def __init__(self, retry_after: float | None = None, reason: str = "") -> None:
        if retry_after is not None and (
            type(retry_after) not in (int, float) or not 0 <= retry_after <= sys.float_info.max
        ):
            problem = seconds_problem(retry_after, "Throttle(retry_after=...)")
            if problem is not None:
                raise ConfigurationError(
                    f"{problem}; pass seconds >= 0 (a 429's Retry-After), or None for about "
                    "a second"
                )
        super().__init__(reason or "throttled by the service it calls")
        self.retry_after = retry_after
        self.reason = reason


class Reject(Exception):
    """Raised by a task to send its message straight to the dead letters, with ``reason``."""

    def __init__(self, reason: str = "rejected by the task") -> None:
        super().__init__(reason)
        self.reason = reason
