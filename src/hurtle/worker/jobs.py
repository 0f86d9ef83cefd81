"""What the processor carries a delivery in: the ``Pipeline`` of middleware hooks composed once
per task, the ``Job`` made per message of a task that needs one, the ``BatchState`` an executor
shares with ``Processor.process_many``, and how an executor enforces a time limit (``Limit``,
``late_limit``). ``processor`` re-exports them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import msgspec

from ..brokers import Delivery, StoredResult
from ..errors import TimeLimitExceeded
from ..message import Message
from ..middleware import JOB_HOOKS, Middleware, Outcome, overrides
from ..sealing import SEALED, open_message
from ..workflows import FLOW

if TYPE_CHECKING:
    from ..task import Task


class BatchState(Protocol):
    """What ``process_many`` reads and keeps up to date for the executor driving it."""

    #: Set (from a signal handler or another thread) to start nothing more.
    stopping: bool
    #: The delivery whose task runs now, so that a hard stop can hand it back. It is cleared as
    #: soon as the call returns, before the outcome is recorded: a hard stop never hands back a
    #: delivery that has an outcome.
    current: Delivery | None
    #: Where the deliveries left unstarted by a stop go.
    unstarted: list[Delivery]
    #: The batch's deliveries not taken yet. ``process_many`` takes them from the left; another
    #: thread may take some from the right (to hand them back): each is taken exactly once.
    pending: deque[Delivery]
    #: The time limit of the inline task running now, for an executor whose watchdog enforces
    #: it (``Processor(inline_limits=True)``).
    time_limit: float | None
    #: Deliveries the executor interrupted at their time limit during this batch: one that
    #: returned all the same (it swallowed the error) is failed, not acknowledged.
    overran: list[Delivery]


class Pipeline:
    """The middleware hooks one task runs through, composed once per task.

    Each hook field holds the bound hooks of the middleware that apply to the task and override
    that hook, in registration order. ``per_call`` is True when a call needs more than a plain
    call (per-call hooks, ``async def``, a time limit the executor does not enforce inline);
    ``inline`` when, besides, no middleware applies at all.
    """

    __slots__ = (
        "ack_outcome",
        "admits",
        "after_batch",
        "after_calls",
        "after_outcome",
        "after_process",
        "batched",
        "before_batch",
        "before_process",
        "grouped",
        "inline",
        "middleware",
        "per_call",
        "task",
    )

    def __init__(
        self, task: Task[Any, Any], middleware: Sequence[Middleware], inline_limits: bool = False
    ) -> None:
        used = [
            m for m in middleware if any(overrides(m, h) for h in JOB_HOOKS) and m.applies_to(task)
        ]
        self.task = task
        self.middleware = used
        self.before_batch = [m for m in used if overrides(m, "before_batch")]
        self.after_batch = [m for m in used if overrides(m, "after_batch")]
        self.before_process = [m.before_process for m in used if overrides(m, "before_process")]
        self.after_process = [
            m.after_process for m in reversed(used) if overrides(m, "after_process")
        ]
        self.after_outcome = [m.after_outcome for m in used if overrides(m, "after_outcome")]
        #: Middleware with ``after_calls``: they see acknowledgements there, batch-wide.
        self.after_calls = [m for m in used if overrides(m, "after_calls")]
        #: The ``after_outcome`` hooks that see acknowledgements one by one.
        self.ack_outcome = [
            m.after_outcome
            for m in used
            if overrides(m, "after_outcome") and not overrides(m, "after_calls")
        ]
        self.batched = bool(self.before_batch or self.after_batch)
        #: The ``before_batch`` middleware that decide from counts (``admit``): in a batch they
        #: need no ``Job`` per message.
        self.admits = [m for m in self.before_batch if overrides(m, "admit")]
        #: The middleware a batch shows its jobs of this task to (``before/after_batch``).
        self.grouped = [
            m
            for m in used
            if (m in self.before_batch and m not in self.admits) or m in self.after_batch
        ]
        #: False when only batch hooks (and ``after_calls``, and ``after_outcome`` beside it)
        #: apply: the batch path then calls the task inline too.
        self.per_call = bool(
            self.before_process
            or self.after_process
            or self.ack_outcome
            or task.is_async
            or (task.time_limit is not None and not inline_limits)
        )
        self.inline = not used and not self.per_call


class Job(msgspec.Struct, eq=False):
    """One decoded delivery and the task it names, on its way through the processor.

    A struct, not a plain class: made per message of a task that has a pipeline, it is built
    about twice as fast; ``eq=False`` keeps identity equality and hashing.
    """

    delivery: Delivery
    message: Message
    task: Task[Any, Any]
    pipeline: Pipeline | None = None
    #: ``time.monotonic()`` when the call started and when it ended (0 until then).
    started: float = 0.0
    finished: float = 0.0
    deferred: bool = False
    defer_delay: float = 0.0
    defer_reason: str = ""
    #: True while the job is part of a batch whose batch hooks the batch path runs.
    batch: bool = False
    #: True for a job whose batch hooks run around it alone (met outside a batch).
    alone: bool = False
    #: Set once the outcome is handed to the acker.
    outcome: Outcome | None = None
    #: The result to store with the acknowledgement (set by the results middleware).
    stored: StoredResult | None = None
    #: The workflow header (``hurtle.workflows.Flow``) of a chain link or chord member.
    flow: Any = None
    #: Deferrals so far in this process: a batch whose count did not move deferred nothing.
    deferrals: ClassVar[int] = 0

    def defer(self, delay: float, reason: str = "") -> None:
        """Put the message back in its queue, due in ``delay`` seconds, without running it and
        without spending an attempt (from ``before_batch``)."""
        self.deferred = True
        self.defer_delay = max(float(delay), 0.0)
        self.defer_reason = reason
        Job.deferrals += 1

    def call(self) -> Any:
        """Call the task function (a coroutine function returns its coroutine). Sealed
        arguments are opened by an encrypted task's ``run``; those of a task that does not seal
        its own (a workflow's sealed result passed on, a sender that seals what this worker's
        task does not) here."""
        m = self.message
        if m.headers and SEALED in m.headers and not self.task.encrypt:
            args, kwargs = open_message(self.task.app.keyring, m)
            return self.task.fn(*args, **kwargs)
        return self.task.run(*m.args, **m.kwargs)

    def arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments, opened if they are sealed (``SealError`` if they cannot be):
        for what reads them besides the call (limit keys, the check of a failed call)."""
        m = self.message
        if m.headers and SEALED in m.headers:
            return open_message(self.task.app.keyring, m)
        return m.args, m.kwargs

    def time_limit_error(self) -> TimeLimitExceeded:
        limit = self.task.time_limit
        return TimeLimitExceeded(
            f"task {self.task.name}[{self.message.id}] ran longer than its time limit of "
            f"{limit:g}s and was stopped"
        )

    def overran(self) -> bool:
        limit = self.task.time_limit
        return limit is not None and time.monotonic() - self.started > limit


#: How an executor runs a time-limited call: ``limit(job, call)`` returns what ``call`` returns,
#: or raises ``TimeLimitExceeded`` (or stops the call some other way and says so).
Limit = Callable[[Job, Callable[[], Any]], Any]


def late_limit(job: Job, call: Callable[[], Any]) -> Any:
    """The fallback when a call cannot be interrupted: let it end, then fail it if it overran."""
    result = call()
    if job.overran():
        raise job.time_limit_error()
    return result


def off_path(task: Task[Any, Any], headers: dict[str, Any]) -> bool:
    """True when a message of ``task`` with these (non-empty) headers takes the job path even
    if its task is called inline: a workflow's, or one whose arguments are sealed when its
    task's own are not (``Job.call`` opens them). Read only for messages that have headers."""
    return FLOW in headers or (SEALED in headers and not task.encrypt)


def take_all(pending: deque[Delivery]) -> Iterator[Delivery]:
    """Take what is left of a batch, one at a time (another thread may take from the right)."""
    take = pending.popleft
    while True:
        try:
            yield take()
        except IndexError:
            return
