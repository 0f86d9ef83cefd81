"""What an executor shares with the processor: the ``BatchState`` it drives
``Processor.process_many`` with, and how it enforces a time limit (``Limit``, ``late_limit``).
``processor`` re-exports them, with the ``Job`` and ``Pipeline`` it carries a delivery in (their
home is ``hurtle.middleware``: they are what the hooks see)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..brokers import Delivery
from ..flow import FLOW
from ..middleware import Job
from ..sealing import SEALED

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
