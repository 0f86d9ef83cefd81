"""Unique tasks (``unique_for``): the worker's side.

The lock is taken when the message is published (``Task.send``, ``Broker.publish_unique``) and
named in its ``unique`` field, with when it ends at the latest in ``unique_until`` (the call's
``created`` plus ``unique_for``, by the sender's clock); messages of older senders name it in
``headers["unique"]`` and ``headers["unique_until"]`` (``message.lock_of``). It ends when the
message's outcome is settled — acknowledged or dead-lettered; a retry keeps it, since the
message is still waiting — with the acker's next flush, in one broker call for the batch, or
at that latest end, whichever comes first: a worker that dies holding the message cannot keep
the lock for ever. This middleware releases the locks of acknowledged calls; every road to a
dead letter (failed for good, expired, cancelled, an unknown task, ...) releases its message's
lock where the worker decides that it is dead (``worker.ends``), and a message the broker
dead-letters itself (its workers kept dying) has its lock ended by the broker in that step.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..brokers import UniqueLocks
from ..message import lock_of
from . import Calls, Middleware, Outbox, WorkerParts

if TYPE_CHECKING:
    from ..task import Task


class UniqueMiddleware(Middleware):
    """Releases the unique locks of acknowledged messages."""

    def __init__(self) -> None:
        self._acker: Outbox | None = None

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.limits is not None and task.limits.unique_for is not None

    def worker_start(self, worker: WorkerParts) -> None:
        self._acker = worker.acker

    def after_calls(self, calls: Calls) -> None:
        # the acknowledgements of calls of one queue: their locks go in one list
        messages = calls.messages
        if self._acker is None or not messages:
            return
        keys = list(map(_UNIQUE, messages))
        if not calls.failures and all(keys):
            # the usual batch: every lock in the messages' fields, read in columns (a few C
            # loops, no Python one)
            self._acker.release_unique_batch(
                UniqueLocks(
                    calls.deliveries[0].queue,
                    keys,
                    list(map(_ID, messages)),
                    list(map(_UNTIL, messages)),  # 0 (an int) where unknown
                )
            )
            return
        failed = calls.failures
        locks = [
            (d.queue, lock[0], m.id, lock[1])
            for i, (d, m) in enumerate(zip(calls.deliveries, messages, strict=True))
            if i not in failed and (lock := lock_of(m)) is not None
        ]
        self._acker.release_uniques(locks)


_UNIQUE = attrgetter("unique")
_UNTIL = attrgetter("unique_until")
_ID = attrgetter("id")
