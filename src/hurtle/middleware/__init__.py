"""Cross-cutting features as middleware: hooks around publishing, batches and task calls.

A middleware subclasses ``Middleware`` and overrides only the hooks it needs. It is registered on
the app (``Hurtle(middleware=[...])``, ``app.add_middleware(m)``); built-in features (retries,
and the features switched on by task options) are middleware too, registered by the app itself
(``Hurtle._builtin_middleware``), before the user's.

Features cost per batch, not per task: the worker composes, once per task (when it first sees
it), the list of middleware whose ``applies_to`` says yes *and* that override a worker-side hook
(``Pipeline``).
A task with an empty list, no time limit and no ``async def`` runs on the processor's inline path,
whatever other tasks use. Hooks a middleware does not override are never called, and a publish
calls ``before_publish`` only on middleware that override it.

A failing call's outcome (retry with backoff, or dead letter) is decided by the built-in
``Retries`` policy, consulted only when a call fails: it takes no task off the inline path.

The other built-ins are switched on by task options: stored results (``results.py``), rate and
concurrency limits (``limits.py``) and unique tasks (``unique.py``).

What the hooks are handed is declared here, below the worker that makes it: the ``Job`` a
delivery travels in, the ``Outcome`` it ends with, and the ``Calls`` of a task that returned.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import msgspec

from ..brokers import Delivery, StoredResult
from ..errors import TimeLimitExceeded
from ..message import Message
from ..sealing import SEALED, open_message

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..brokers import Consumer, Lock, UniqueLocks
    from ..task import Task


class Outbox(Protocol):
    """What a middleware may hand the worker's acker: writes that go out with its next flush,
    in the broker call that carries the acknowledgements."""

    def store_result(self, message_id: str, payload: bytes, ttl: float) -> None: ...

    def release_slots(self, key: str, count: int) -> None: ...

    def release_unique_batch(self, locks: UniqueLocks) -> None: ...

    def release_uniques(self, locks: list[Lock]) -> None: ...


class Pool(Protocol):
    """What a middleware may read of the worker's executor."""

    @property
    def concurrency(self) -> int: ...

    #: True when a batch's calls run one after another in the thread that submits them (solo).
    @property
    def runs_in_submit(self) -> bool: ...


class WorkerParts(Protocol):
    """What ``worker_start`` and ``worker_stop`` show a middleware of its worker (a
    ``hurtle.worker.Worker``): its app, its session with the broker, its acker and executor."""

    @property
    def app(self) -> Hurtle: ...

    @property
    def consumer(self) -> Consumer | None: ...

    @property
    def acker(self) -> Outbox | None: ...

    @property
    def executor(self) -> Pool: ...


class Outcome(msgspec.Struct):
    """How a job ended: ``kind`` is "ack", "retry", "dead" or "deferred".

    ``result`` is the return value on "ack"; ``error`` the exception on "retry" and "dead" (None
    for a deferral); ``message`` the next attempt on "retry"; ``reason`` the dead letter's reason.
    """

    kind: str
    result: Any = None
    error: BaseException | None = None
    message: Message | None = None
    reason: str = ""


class Calls:
    """Calls of one task, fetched from one queue, that returned, what ``after_calls`` sees (a
    long batch's in several parts): one column per field, one row per call, so that a hook
    costs a loop (or a comprehension) per batch, not a call per task. ``deliveries[i]``,
    ``messages[i]``, ``results[i]`` (the return value) and ``runtimes[i]`` (seconds the call
    ran) describe call ``i``. A hook may set ``stored`` (one ``StoredResult`` per call, in
    order, or ``StoredResults``, the same in columns: each is written with its call's
    acknowledgement) and fail a call with ``fail(i, error)``."""

    __slots__ = (
        "deliveries",
        "failures",
        "jobs",
        "messages",
        "results",
        "runtimes",
        "stored",
        "task",
    )

    def __init__(self, task: Task[Any, Any]) -> None:
        self.task = task
        self.deliveries: list[Delivery] = []
        self.messages: list[Message] = []
        self.results: list[Any] = []
        self.runtimes: list[float] = []
        #: The jobs of the calls, when the batch made some (tasks with batch hooks), else None.
        self.jobs: list[Job] | None = None
        #: The results to store with the acknowledgements, one per call, or None.
        self.stored: Sequence[StoredResult] | None = None
        #: Calls that fail all the same: index -> error (``fail``).
        self.failures: dict[int, Exception] = {}

    def __len__(self) -> int:
        return len(self.deliveries)

    def fail(self, index: int, error: Exception) -> None:
        """Fail call ``index`` with ``error``, as if it had raised it: it is retried or
        dead-lettered by its policy, and not acknowledged (its ``stored`` entry is ignored)."""
        self.failures[index] = error


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
    def worker_start(self, worker: WorkerParts) -> None:
        """The worker's parts exist (worker.app, worker.consumer, worker.acker) and nothing
        has been fetched yet."""

    def worker_stop(self, worker: WorkerParts) -> None:
        """The worker stopped fetching and its outcomes are flushed, or about to be."""

    def before_batch(self, jobs: list[Job]) -> None:
        """Called with the decoded jobs of a fetched batch whose task this middleware applies to,
        before any of them runs. Mark a job ``job.defer(delay, reason)`` to put it back in its
        queue after ``delay`` seconds without running it and without spending an attempt
        (throttled by a rate or concurrency limit); ``job.deferred`` tells whether it is. Mark
        it ``job.supersede(by)`` to settle it without running it (a debounced call replaced by
        the later call ``by``)."""

    def admit(self, counts: dict[Task[Any, Any], int]) -> dict[str, tuple[int, float, float, str]]:
        """``before_batch`` for a middleware that decides from how many messages of each task
        a batch holds, not from the messages themselves (a rate limit without a key function):
        the processor's batch path calls this instead, with no ``Job`` made per message, once
        per batch with every task this middleware applies to. Return, for each task name whose
        messages may not all run now, ``(how many may, delay of the first one deferred, delay
        added for each next one, reason)``: the rest of that task's messages in the batch (the
        last ones) are deferred as ``job.defer`` would. ``before_batch`` must still be defined:
        it serves a job met outside a batch."""
        return {}

    def superseded(self, messages: list[Message]) -> dict[int, str]:
        """``before_batch`` for a middleware that settles calls replaced by later ones
        (``debounce``) and decides from the messages alone: the processor's batch path calls
        this instead, with no ``Job`` made per message, once per batch with the messages of the
        tasks this middleware applies to. Return, by index into ``messages``, the id of the
        later call that replaced each superseded one: those are settled without running
        (``job.supersede``). ``before_batch`` must still be defined: it serves a job met
        outside a batch."""
        return {}

    def reads_before_calls(self) -> bool:
        """Whether this middleware's ``before_batch`` (or ``admit``, ``superseded``) may read
        the broker for the batch just fetched; asked once per batch of a solo worker, of the
        middleware that define ``before_batch``. While none may, the fetch of the next batch
        is sent at once instead of after those reads (which it would hold up on the broker)."""
        return True

    def before_process(self, job: Job) -> None:
        """Just before the call; raising Retry/Reject skips it (as today)."""

    def after_process(self, job: Job, result: Any, error: BaseException | None) -> None:
        """Just after the call returned (``error`` None) or raised. Raising a ``HurtleError``
        after a call that returned fails that call with it (retried or dead-lettered by its
        policy); any other exception is logged and changes nothing."""

    def after_calls(self, calls: Calls) -> None:
        """Called with calls of one task that returned, before their acknowledgements are
        handed to the acker: the batch-wide counterpart of ``after_process`` and of
        ``after_outcome`` for "ack" (a middleware that overrides this hook never sees an "ack"
        in ``after_outcome``). Called once per task per batch, with all of its calls that
        returned (with one call when a call runs on its own). A task whose middleware override
        only this, ``after_outcome`` and the batch hooks keeps the processor's batch path: no
        hook call, and no ``Job`` unless batch hooks need one, per task.

        A hook that raises is called again with each call on its own: a call it raises on
        then fails with that error (retried or dead-lettered by its policy), as if it had
        called ``fail``; the others are settled with what it recorded for them. A call is
        never acknowledged without what this hook records for it."""

    def after_batch(self, jobs: list[Job]) -> None:
        """After every job of the batch that this middleware applies to has an outcome."""

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        """After the outcome of a job is decided, none of it flushed yet: an "ack" or "deferred"
        is handed to the acker just before, a "retry" or "dead" just after (what this hook
        hands the acker then goes out no later than the outcome). ``outcome.kind`` is "ack",
        "retry", "dead" or "deferred"; ``outcome.result`` the return value on "ack";
        ``outcome.error`` the exception otherwise."""


#: The hooks that run around a task's calls in a worker: a middleware overriding none of them
#: takes no task off the inline path.
JOB_HOOKS = (
    "before_batch",
    "before_process",
    "after_process",
    "after_calls",
    "after_batch",
    "after_outcome",
)


def overrides(middleware: Middleware, hook: str) -> bool:
    """True when ``middleware``'s class defines ``hook`` itself (not the no-op default)."""
    return getattr(type(middleware), hook) is not getattr(Middleware, hook)


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
        "screens",
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
        #: The ``before_batch`` middleware that decide from the messages (``superseded``): in a
        #: batch they need no ``Job`` per message either.
        self.screens = [m for m in self.before_batch if overrides(m, "superseded")]
        #: The middleware a batch shows its jobs of this task to (``before/after_batch``).
        self.grouped = [
            m
            for m in used
            if (m in self.before_batch and m not in self.admits and m not in self.screens)
            or m in self.after_batch
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
    #: The workflow header (``hurtle.flow.Flow``) of a chain link or chord member.
    flow: Any = None
    #: The id of the later call of its debounce key that replaced this one (``supersede``),
    #: else "".
    superseded: str = ""
    #: Jobs set aside so far in this process, deferred or superseded: a batch whose count did
    #: not move set none aside.
    deferrals: ClassVar[int] = 0

    def defer(self, delay: float, reason: str = "") -> None:
        """Put the message back in its queue, due in ``delay`` seconds, without running it and
        without spending an attempt (from ``before_batch``)."""
        self.deferred = True
        self.defer_delay = max(float(delay), 0.0)
        self.defer_reason = reason
        Job.deferrals += 1

    def supersede(self, by: str) -> None:
        """Settle the message without running it: the later call ``by`` of its debounce key
        replaced it (from ``before_batch``; ``middleware.debounce``). It is acknowledged, its
        unique lock released, and a task that keeps results stores a ``superseded`` record."""
        self.superseded = by
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


__all__ = [
    "JOB_HOOKS",
    "Calls",
    "Job",
    "Middleware",
    "Outbox",
    "Outcome",
    "Pipeline",
    "Pool",
    "WorkerParts",
    "overrides",
]
