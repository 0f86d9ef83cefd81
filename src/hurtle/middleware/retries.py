"""Retries, the first built-in middleware: what a failed call leads to.

``Retries.decide`` is consulted only when a call fails (never on success), so a task with a retry
budget stays on the processor's inline path until it fails. It decides, in this order:

* a ``TypeError`` because the message's arguments do not fit the task's signature: dead letter
  at once (no attempt could succeed);
* a ``SealError``: sealed arguments that cannot be opened (a key this worker does not have,
  bytes tampered with), or an encrypted task's arguments unsealed: dead letter at once;
* ``Reject``: dead letter with the task's reason;
* an exception the task's ``retry_on`` (Celery's ``autoretry_for``) does not list, when it lists
  some: dead letter at once (``Retry`` is always retried);
* attempts left (``message.attempt < task.retries``): another attempt after an exponential
  backoff with jitter capped by the app's ``max_retry_delay`` (``backoff``), or after
  ``Retry(delay=...)``'s own delay; the next attempt carries the error in its ``error`` header
  (``next_attempt``);
* else a dead letter with the traceback.

It logs nothing: the worker's call log (``worker/log.py``) writes each failure's line, with
what was decided.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import msgspec

from .._text import describe, safe_str, signature, trace
from ..errors import Reject, Retry, SealError
from ..message import Message
from . import Job, Middleware, Outcome

if TYPE_CHECKING:
    from ..task import Task


def backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds before attempt ``attempt + 1``: ``base * 2**attempt``, capped, with ±25% jitter."""
    delay = min(base * (2.0 ** min(attempt, 62)), cap)
    return max(delay * random.uniform(0.75, 1.25), 0.0)


def next_attempt(message: Message, delay: float, error: str) -> Message:
    """The message to enqueue for the next attempt, due ``delay`` seconds from now."""
    headers = dict(message.headers)
    headers["error"] = error[:1000]
    return msgspec.structs.replace(
        message, attempt=message.attempt + 1, eta=time.time() + delay, headers=headers
    )


def _unfit(job: Job) -> str | None:
    """Why the job's arguments (opened, if sealed) do not fit its task, or None."""
    try:
        args, kwargs = job.arguments()
    except SealError:  # not here: the error speaks for itself
        return None
    return job.task.unfit(args, kwargs)


class Retries(Middleware):
    """The retry policy (always registered by the app): decides the outcome of a failed call."""

    def __init__(self, max_retry_delay: float) -> None:
        self.max_retry_delay = max_retry_delay

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.retries > 0

    def decide(self, job: Job, err: Exception) -> Outcome:
        """The outcome of ``job``'s failed call (the processor logs and records it)."""
        message, task = job.message, job.task
        if isinstance(err, SealError):  # no attempt could open them either
            return Outcome("dead", error=err, reason=f"{err}; not run")
        if isinstance(err, TypeError) and (unfit := _unfit(job)):
            reason = (
                f"task {task.name} cannot be called with the arguments of this message "
                f"({unfit}); retrying cannot help: send it with arguments that match "
                f"{task.name}{signature(task.fn)}, then purge this dead letter"
            )
            return Outcome("dead", error=err, reason=reason)
        if isinstance(err, Reject):
            why = safe_str(err.reason)
            return Outcome("dead", error=err, reason=f"rejected by task {task.name}: {why}")
        summary = describe(err)
        retry_on = task.retry_on
        if retry_on is not None and not isinstance(err, retry_on):
            listed = ", ".join(e.__name__ for e in retry_on[1:]) or "nothing"
            reason = (
                f"task {task.name} raised {type(err).__name__}, which its retry_on does not "
                f"list ({listed}): not retried:\n{trace(err)}"
            )
            return Outcome("dead", error=err, reason=reason)
        if message.attempt < task.retries:
            if isinstance(err, Retry) and err.delay is not None:
                delay = err.delay
            else:
                delay = backoff(message.attempt, task.retry_delay, self.max_retry_delay)
            return Outcome("retry", error=err, message=next_attempt(message, delay, summary))
        reason = (
            f"task {task.name} failed on attempt {message.attempt + 1} of {task.retries + 1}; "
            f"no retries left:\n{trace(err)}"
        )
        return Outcome("dead", error=err, reason=reason)
