"""Eager mode: ``with eager(app):`` runs each send in this process before the send returns.

Inside the block the app's broker is an ``EagerBroker``: a fresh ``memory://`` store of its own
(the app's real broker is neither used nor connected) whose publishes, once stored, run a real
``Worker`` in burst mode on the sending thread (``solo`` pool) until the store is idle. So a
message is encoded and decoded as in production and goes through the app's middleware: results
are stored, failures retried or dead-lettered by the task's policy, limits apply, workflows
complete (every step a task sets off runs before the send returns, on whatever queue).

What differs from a worker elsewhere, on purpose:

* delays do not wait: a ``delay``/``eta`` send and a retry's backoff run at once
  (``MemoryBroker.fast_forward``). A message a rate or concurrency limit throttles does wait its
  turn, as it would in production (the send returns later);
* periodic tasks are not scheduled (send them to test them);
* a send in the application's transaction (``options(connection=conn)``) runs at the send too,
  whether the transaction commits or not: the connection is not used;
* ``propagate=True`` raises, at the send, the exception of a call that failed for good (the
  first one, once its retries are spent), instead of leaving it to ``Handle.result``'s
  ``TaskFailed``;
* a send made while a run is under way (by a task, or from another thread) is run by that run:
  a task's own sends have run when the outer send returns.

A send from a thread whose asyncio loop is running (an ``async`` test) runs its worker on a
helper thread and waits for it, since the worker's ``async def`` tasks need loops of their own.

Nothing here is on the path of an app outside the block: its broker is only swapped for the
block's length.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..brokers.memory import MemoryBroker
from ..brokers.memory_consumer import MemoryConsumer
from ..ids import new_id
from ..middleware import Calls, Middleware, Outcome
from .summary import Summary

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..brokers import Consumer, Delivery
    from ..message import Message
    from ..middleware import Job


class EagerConsumer(MemoryConsumer):
    """A consumer of the eager store: delayed messages are due now, and a fetch does not wait
    when nothing can come: no throttled message is due later and no other consumer (a worker
    someone started on the store) holds a message that could set off another."""

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        b = self.broker
        b.fast_forward(self.queues)
        with b._lock:
            waiting = b._next_eta_locked(self.queues) is not None or any(
                held for worker, held in b._held.items() if worker != self.worker_id
            )
        return super().fetch(max_count, timeout if waiting else 0.0)


class _Failures(Middleware):
    """Keeps the exception of each call that failed for good (``eager(propagate=True)``)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def after_calls(self, calls: Calls) -> None:
        """Nothing: defined so that tasks keep the batch path (``after_outcome`` then sees no
        acknowledgement one by one)."""

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        if outcome.kind == "dead" and outcome.error is not None:
            error = outcome.error
            error.add_note(f"(task {job.task.name}[{job.message.id}], run eagerly by hurtle)")
            self.errors.append(error)


class EagerBroker(MemoryBroker):
    """``memory://`` that runs what it stores: see the module docstring."""

    def __init__(self, app: Hurtle, *, propagate: bool = False) -> None:
        s = app.settings
        super().__init__(
            "memory://",
            heartbeat_timeout=s.heartbeat_timeout,
            dead_letter_max=s.dead_letter_max,
            dead_letter_ttl=s.dead_letter_ttl,
            max_recoveries=s.max_recoveries,
        )
        self.app = app
        self.propagate = propagate
        #: What the runs of this store ran so far.
        self.summary = Summary()
        self._state = threading.Lock()  # guards _running
        self._running = False

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> Consumer:
        return EagerConsumer(self, tuple(queues), worker_id or f"eager-{new_id()}")

    # -- every way in runs what came in ------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> None:
        super().publish(messages)
        self.run()

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        ids = super().publish_unique(messages, unique_for)
        self.run()
        return ids

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        super().publish_raw(queue, payloads)
        self.run()

    def publish_in(
        self, connection: object, messages: Sequence[Message], unique_for: float | None = None
    ) -> list[str]:
        """A send in the application's transaction (``options(connection=...)``) runs at the
        send, as every eager send does: the store is not the database, and the connection is
        not used."""
        if unique_for is not None:
            return self.publish_unique(messages, unique_for)
        self.publish(messages)
        return [m.id for m in messages]

    # -- running ---------------------------------------------------------------------------

    def run(self) -> None:
        """Run workers until the store is idle, unless a run is under way (it takes what was
        just stored: see ``_run_until_idle``)."""
        with self._state:
            if self._running:
                return
            self._running = True
        failures = _Failures() if self.propagate else None
        try:
            if _loop_running():
                _on_helper_thread(lambda: self._run_until_idle(failures))
            else:
                self._run_until_idle(failures)
        except BaseException:
            with self._state:
                self._running = False
            raise
        if failures is not None and failures.errors:
            raise failures.errors[0]

    def _run_until_idle(self, failures: _Failures | None) -> None:
        """Run burst workers until no queue holds anything, then end the run."""
        from ..worker import Worker

        middleware = [failures] if failures is not None else []
        while True:
            # every queue that holds something: a task may send to one no task names
            queues = sorted(set(self.app.queues()) | set(self.queues()))
            worker = Worker(
                self.app, queues=queues, burst=True, scheduler=False, middleware=middleware
            )
            worker.run()
            assert worker.processor is not None
            self.summary.add(worker.processor.tally.snapshot())
            # checked under ``_state``: a publisher that found a run under way had stored its
            # messages before it looked, so they are seen here, or it looks after this run
            # ended and runs them itself
            with self._state:
                if not self._waiting():
                    self._running = False
                    return

    def _waiting(self) -> bool:
        """True when some queue the last worker did not consume holds messages."""
        return any(
            not s.paused and (s.ready or s.delayed or s.in_flight) for s in self.stats().values()
        )


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _on_helper_thread(run: Callable[[], None]) -> None:
    """Call ``run`` on a thread of its own and wait; what it raises is raised here."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as err:
            raised.append(err)

    thread = threading.Thread(target=target, name="hurtle-eager")
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


@contextlib.contextmanager
def eager(app: Hurtle, *, propagate: bool = False) -> Iterator[Summary]:
    """Within the block, each send of ``app`` runs its task (and whatever it sets off) before
    returning; yields the ``Summary`` of what ran, kept up to date.

    ``propagate=True``: a call that fails for good raises its exception at the send. Handles
    read their results from the block's store: read them inside the block. The app's own
    broker is back in place afterwards (and was not connected for the block)."""
    broker = EagerBroker(app, propagate=propagate)
    with app._broker_lock:  # the app's broker for the block's length
        previous, app._broker = app._broker, broker
    try:
        yield broker.summary
    finally:
        with app._broker_lock:
            if app._broker is broker or app._broker is None:  # None: app.close() inside
                app._broker = previous
        broker.close()
