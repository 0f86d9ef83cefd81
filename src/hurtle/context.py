"""``hurtle.current()``: the task running now, seen from inside it — its message id, its task,
``progress(fraction, message)`` to report how far it got, and ``cancelled``.

It costs the tasks that never ask nothing per call. The worker's task loops already record
which delivery runs now (for a hard stop, a time limit, a slow batch's hand-back); each runner
(the solo loop, a thread or greenlet of a pool, the asyncio pool's loop) tells this module once,
when it starts, where that record is (``bind``), and ``current()`` reads it when a task asks.
Its id is read then (the rest of the message only if asked), once per call that asks: the
context is kept for the next ``current()`` of the same call.

What the context writes goes to the worker's ``Tracker`` (``worker.tracker``): a progress
report is kept on the context itself (a tuple and an attribute store), and the context is handed
to the tracker on its first report since its last write; the tracker writes the latest report of
every context it was handed in one broker call per interval (``hurtle.progress.INTERVAL``). A
report costs its task no lock, no clock read and no broker call. The tracker also learns which
running tasks were cancelled (``Hurtle.cancel``) with one broker call per interval, for the
tasks that ran through a whole interval.

Outside a worker (a task called as a plain function, ``hurtle.testing``'s eager runs) there is
no running message: ``current()`` raises ``HurtleError``, and ``current(None)`` returns None.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, overload

import msgspec

from .brokers import Delivery
from .errors import HurtleError
from .message import Message, message_id
from .progress import MAX_MESSAGE, check_progress


class Tracker(Protocol):
    """What a worker gives the tasks it runs (``worker.tracker.Tracker``)."""

    #: Ids of the running messages that were cancelled (read under the GIL, without a lock).
    cancelled: set[str]

    def report(self, context: Current) -> None:
        """Write the latest report of ``context`` at the next interval (``Current.take_report``;
        its message id is read then). Called on a context's first report since its last write,
        not on every report."""


class Current(msgspec.Struct, gc=False, eq=False):
    """The task running now (``hurtle.current()``).

    ``id`` is its message id; ``task``, ``queue`` and ``attempt`` (how many attempts ran before
    this one: 0 on the first) are read from its message when asked.

    A msgspec ``Struct`` kept out of the garbage collector's sight (``gc=False``): one is made
    per call that asks, and a context that reported is held until its report is written; a
    plain object would be traversed by every collection meanwhile. It is in no reference cycle
    once written (``Tracker.flush`` lets go of it).
    """

    #: The running ``Delivery`` (or ``Job``), and where its reports go.
    _running: Any
    _tracker: Tracker
    #: Its message, once asked (``message``).
    _message: Message | None = None
    _id: str = ""
    #: The latest report, and whether the tracker holds this context to write it.
    _report: tuple[float, str] = (0.0, "")
    _queued: bool = False

    @property
    def id(self) -> str:
        """The running message's id."""
        if not self._id:
            running = self._running  # a delivery, or a job holding its message decoded
            self._id = (
                message_id(running.raw) if isinstance(running, Delivery) else running.message.id
            )
        return self._id

    def __repr__(self) -> str:
        return f"<Current {self.task}[{self.id}]>"

    @property
    def message(self) -> Message:
        """The running message (decoded once, when first asked)."""
        if self._message is None:
            running = self._running
            self._message = (
                Message.decode(running.raw) if isinstance(running, Delivery) else running.message
            )
        return self._message

    @property
    def task(self) -> str:
        return self.message.task

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def attempt(self) -> int:
        return self.message.attempt

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the task got: ``fraction`` from 0 to 1 and a line of text.

        Cheap in a tight loop: the report is kept in memory, and the worker writes the latest
        report of each of its tasks in one broker call per interval (half a second), also once
        the task ended. ``Handle.progress()`` reads it; the dashboard's task page shows it.
        """
        if type(fraction) is not float or not 0.0 <= fraction <= 1.0 or type(message) is not str:
            fraction, message = check_progress(fraction, message)  # (NaN fails the compare)
        elif len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE]
        # stored before ``_queued`` is read, which ``take_report`` clears before it reads the
        # report: a report is either seen by the write under way or queued for the next one
        self._report = (fraction, message)
        if not self._queued:
            self._queued = True
            self._tracker.report(self)

    def take_report(self) -> tuple[float, str]:
        """The latest report, for the tracker writing it: a report made from now on hands this
        context to the tracker again."""
        self._queued = False
        return self._report

    def keep_report(self) -> None:
        """Hand this context back to its tracker, whose write of its report failed: the next
        write takes it (or whatever was reported since)."""
        if not self._queued:
            self._queued = True
            self._tracker.report(self)

    @property
    def cancelled(self) -> bool:
        """True once ``Hurtle.cancel`` named this message while it ran (the worker learns of
        it within an interval): the task should stop soon. Whatever it returns then, its
        outcome is recorded as ``cancelled``."""
        return self.id in self._tracker.cancelled


class _Binding:
    """What one runner told ``bind``: ``where`` and ``tracker``; and the context last made
    (``context``) with the running item it was made for (``seen``, held: no other item can
    have its identity meanwhile)."""

    __slots__ = ("context", "seen", "tracker", "where")

    def __init__(self, where: Callable[[], Any], tracker: Tracker) -> None:
        self.where = where
        self.tracker = tracker
        self.seen: Any = None
        self.context: Any = None


#: Per runner (thread or greenlet): its ``_Binding`` (``binding``), one thread-local read per
#: ``current()``. Made on first use, not on import: under gevent or eventlet,
#: ``threading.local`` is the greenlet-local one only once the worker patched it.
_bound: Any = None
_making = threading.Lock()


def _runner() -> Any:
    global _bound
    bound = _bound
    if bound is None:
        with _making:
            if _bound is None:
                _bound = threading.local()
            bound = _bound
    return bound


def bind(where: Callable[[], Any], tracker: Tracker) -> None:
    """Tell ``current()``, on this runner (thread or greenlet), how to find what runs now:
    ``where()`` returns the running ``Delivery`` (or a ``Job`` holding it), or None between
    calls. Called once per runner, never per call."""
    _runner().binding = _Binding(where, tracker)


def unbind() -> None:
    """Forget this runner's binding (its worker stopped)."""
    _runner().binding = None


#: ``current()``'s default: raise outside a task.
_RAISE: Any = object()


@overload
def current() -> Current: ...


@overload
def current(default: None) -> Current | None: ...


def current(default: object = _RAISE) -> Current | None:
    """The task running now on this thread, greenlet or asyncio task (``Current``).

    Outside a task run by a worker it raises ``HurtleError``, or returns ``None`` when called
    as ``current(None)``.
    """
    bound = _bound if _bound is not None else _runner()
    try:
        binding: _Binding | None = bound.binding  # None once unbound
    except AttributeError:  # never bound on this runner
        binding = None
    if binding is not None:
        running = binding.where()
        if running is not None:
            if running is binding.seen:
                cached: Current = binding.context
                return cached
            context = binding.context = Current(running, binding.tracker)
            binding.seen = running
            return context
    if default is not _RAISE:
        return None
    raise HurtleError(
        "hurtle.current() is called outside a task run by a worker: it describes the "
        "message a worker runs now (call current(None) to get None there instead)"
    )


__all__ = ["Current", "Tracker", "bind", "current", "unbind"]
