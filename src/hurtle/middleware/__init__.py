"""Cross-cutting features, each in its own module, hooked around tasks and batches.

A middleware subclasses ``Middleware`` and overrides only the hooks it needs. The processor asks
each middleware once per task whether it ``applies_to`` it, and calls the hooks only for tasks
it applies to: a task that no middleware applies to runs on the short path, at full speed.

Built-in middleware are switched on by task options (``Hurtle._builtin_middleware``): limits
(``limits.py``) and unique tasks (``unique.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..message import Message

if TYPE_CHECKING:
    from ..task import Task
    from ..worker import Worker
    from ..worker.processor import Job


class Outcome:
    """How a job ended: ``kind`` is "ack", "retry", "dead" or "deferred"; ``result`` the return
    value on "ack"; ``error`` the exception otherwise."""

    __slots__ = ("error", "kind", "result")

    def __init__(self, kind: str, result: Any = None, error: BaseException | None = None
                 ) -> None:
        self.kind = kind
        self.result = result
        self.error = error


class Middleware:
    """No-op hooks; a subclass overrides what it needs."""

    def applies_to(self, task: Task[Any, Any]) -> bool:
        """Whether this middleware has anything to do for ``task``; asked once per task when the
        worker starts (and when a task is registered later), never per message. A task that no
        middleware applies to runs on the inline path."""
        return True

    # -- producer side ------------------------------------------------------------------------
    def before_publish(self, messages: list[Message]) -> list[Message]:
        """Called with each batch about to be published (send, send_many); returns the batch to
        publish (it may add headers with msgspec.structs.replace) or raises a HurtleError to
        refuse it (nothing is published)."""
        return messages

    # -- worker side --------------------------------------------------------------------------
    def worker_start(self, worker: Worker) -> None:
        """The worker's parts exist (worker.app, worker.consumer, worker.acker) and nothing
        has been fetched yet."""

    def worker_stop(self, worker: Worker) -> None:
        """The worker stopped fetching and its outcomes are flushed, or about to be."""

    def before_batch(self, jobs: list[Job]) -> None:
        """Called with the decoded jobs of a fetched batch whose task this middleware applies to,
        before any of them runs. Mark a job ``job.defer(delay, reason)`` to put it back in its
        queue after ``delay`` seconds without running it and without spending an attempt
        (throttled by a rate or concurrency limit); ``job.deferred`` tells whether it is."""

    def before_process(self, job: Job) -> None:
        """Just before the call; raising Retry/Reject skips it (as today)."""

    def after_process(self, job: Job, result: Any, error: BaseException | None) -> None:
        """Just after the call returned (``error`` None) or raised."""

    def after_batch(self, jobs: list[Job]) -> None:
        """After every job of the batch that this middleware applies to has an outcome."""

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        """After the outcome of a job is decided (handed to the acker, not yet flushed):
        ``outcome.kind`` is "ack", "retry", "dead" or "deferred"; ``outcome.result`` the
        return value on "ack"; ``outcome.error`` the exception otherwise."""


__all__ = ["Middleware", "Outcome"]
