"""Unique tasks (``unique_for``): the worker's side.

The lock is taken when the message is published (``Task.send``, ``Broker.publish_unique``) and
named in its ``headers["unique"]``, with when it ends at the latest in
``headers["unique_until"]`` (the call's ``created`` plus ``unique_for``, by the sender's clock).
It ends when the message's outcome is settled — acknowledged or dead-lettered; a retry keeps
it, since the message is still waiting — with the acker's next flush, in one broker call for the
batch, or at that latest end, whichever comes first: a worker that dies holding the message
cannot keep the lock for ever.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..brokers import UniqueLocks
from . import Calls, Middleware, Outcome

if TYPE_CHECKING:
    from ..task import Task
    from ..worker import Worker
    from ..worker.acker import Acker
    from ..worker.jobs import Job


class UniqueMiddleware(Middleware):
    """Releases the unique locks of settled messages."""

    def __init__(self) -> None:
        self._acker: Acker | None = None

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.limits is not None and task.limits.unique_for is not None

    def worker_start(self, worker: Worker) -> None:
        self._acker = worker.acker

    def after_calls(self, calls: Calls) -> None:
        # the acknowledgements of a batch: their locks go in one list
        if self._acker is None:
            return
        failed = calls.failures
        deliveries, messages = calls.deliveries, calls.messages
        queue = deliveries[0].queue if deliveries else ""
        if not failed and len(set(map(_QUEUE_OF, deliveries))) == 1:
            # the usual batch: the locks in columns, and the common case read without a loop
            # of Python per lock beyond these comprehensions
            headers = [m.headers for m in messages]
            keys: list[Any] = [h.get("unique") for h in headers]
            untils: list[Any] = [h.get("unique_until") for h in headers]
            if set(map(type, keys)) == {str}:
                if not set(map(type, untils)) <= {float}:
                    untils = [_until(h) for h in headers]
                self._acker.release_unique_batch(
                    UniqueLocks(queue, keys, [m.id for m in messages], untils)
                )
                return
        locks = [
            (d.queue, key, m.id, _until(m.headers))
            for i, (d, m) in enumerate(zip(deliveries, messages, strict=True))
            if isinstance(key := m.headers.get("unique"), str) and i not in failed
        ]
        self._acker.release_uniques(locks)

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        # acknowledgements come through ``after_calls``
        if outcome.kind != "dead" or self._acker is None:
            return
        headers = job.message.headers
        key = headers.get("unique")
        if isinstance(key, str):
            self._acker.release_unique(job.delivery.queue, key, job.message.id, _until(headers))


_QUEUE_OF = attrgetter("queue")


def _until(headers: dict[str, Any]) -> float:
    """When a message's lock ends at the latest (``headers["unique_until"]``), 0 if unknown."""
    until = headers.get("unique_until")
    return float(until) if type(until) is float or type(until) is int else 0.0
