"""The executor interface: how fetched deliveries get run, whatever the concurrency mode.

The worker's fetch loop asks an executor how many deliveries it can take (``wait_for_capacity``),
fetches at most that many, and hands them over (``submit``). The executor runs each through the
``Processor`` it was started with. To stop, the worker calls ``stop`` (start nothing new; the
unstarted come back), ``join`` (let running deliveries finish, up to a deadline), then ``abort``
(give up on what still runs; it comes back too) and ``close``.

Time limits are the executor's business too (``limit``), because only it knows how a running call
can be stopped: a signal on the main thread, a timeout in a greenlet, cancellation on a loop, or,
for a thread, nothing at all — the call is abandoned and failed.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from ...brokers import Delivery
from ..processor import Job, Processor, late_limit


class Executor(abc.ABC):
    #: Deliveries that may run at once (the most, when the pool scales itself).
    concurrency: int
    #: True when runners are greenlets sharing one OS thread (``async def`` tasks share a loop).
    greenlets = False
    #: True when ``submit`` runs the batch before it returns (solo): the fetch loop then asks
    #: the broker for the next batch first, so that the round trip overlaps the work.
    runs_in_submit = False

    @abc.abstractmethod
    def start(self, processor: Processor) -> None:
        """Get ready to run deliveries through ``processor``."""

    @abc.abstractmethod
    def wait_for_capacity(self, timeout: float) -> int:
        """How many more deliveries to fetch now; waits up to ``timeout`` while that is 0."""

    @abc.abstractmethod
    def submit(self, deliveries: list[Delivery]) -> None:
        """Run these deliveries (the solo executor runs them before returning)."""

    @abc.abstractmethod
    def idle(self) -> bool:
        """True when nothing is running or waiting to run."""

    @abc.abstractmethod
    def stop(self) -> list[Delivery]:
        """Start nothing new from now on; return the deliveries that were never started."""

    @abc.abstractmethod
    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for running deliveries to finish; True once none runs."""

    @abc.abstractmethod
    def abort(self) -> list[Delivery]:
        """Give up on running deliveries (their outcome will not be recorded); return them."""

    def waiting(self) -> list[Delivery]:
        """A snapshot of the deliveries this executor holds and has not started (buffered,
        or waiting in a batch), for ``Screen`` to check against cancellations."""
        return []

    def request_stop(self) -> None:
        """Ask to start nothing new, from a signal handler or another thread: set flags only."""
        return None  # pools notice the worker's own stop flag soon enough

    def close(self) -> None:
        """Let go of threads, loops and the like, after ``stop`` (and ``abort``)."""
        return None

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        """Run a time-limited call, stopping it at ``job.task.time_limit`` if this pool can.

        The default cannot interrupt: the call ends when it ends, and fails if it overran.
        """
        return late_limit(job, call)

    def watches_time_limits(self) -> bool:
        """True when this executor, started on the calling thread, enforces time limits of tasks
        run inline by ``Processor.process_many`` (its ``BatchState.time_limit``) by itself."""
        return False

    def abandoned(self) -> int:
        """Calls given up at their time limit that are still running somewhere in this process."""
        return 0

    def running(self) -> int:
        """How many calls run now: read from another thread once per heartbeat report, without a
        lock (a snapshot that may be a moment old)."""
        return 0

    def running_items(self) -> list[Any]:
        """The deliveries (or jobs) running now, a snapshot read from another thread: the
        tracker asks the broker whether those that run long were cancelled."""
        return []

    def cancel_running(self, items: list[Any]) -> None:
        """``Hurtle.cancel`` named these running items (from ``running_items``): stop them
        where this pool can. The default stops nothing: the tasks see
        ``hurtle.current().cancelled`` (cooperative), and their outcome is ``cancelled``."""
        return None

    def interrupts_caller(self) -> bool:
        """True while a task runs on the fetch loop's own thread (solo), so that a hard stop must
        raise in it to interrupt it."""
        return False
