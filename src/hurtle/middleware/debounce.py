"""Debounced tasks (``debounce=``): the worker's side, one broker read per batch.

A debounced call is published due ``debounce`` seconds after its send and recorded as the
latest of its key (``hurtle.debounce``, ``sending.publish_latest``). Before a fetched batch
runs (``before_batch``), the latest ids of the keys its debounced messages name are read in one
``Broker.get_latest`` call; a message that is not the latest of its key was replaced by a later
call and is settled without running (``Job.supersede``: acknowledged, its unique lock released,
a ``superseded`` record for a task that keeps results). A key with no record (it expired, or
the send that published the message failed before recording it) runs its message.

Only tasks registered with ``debounce=`` get this middleware: a batch without their messages
makes no call, and their calls cost a ``Job`` each and a share of one read per batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..debounce import DEBOUNCE, latest_name
from . import Job, Middleware, WorkerParts

if TYPE_CHECKING:
    from ..brokers import Broker
    from ..task import Task


class DebounceMiddleware(Middleware):
    """Settles, unrun, the debounced calls that later calls of their keys replaced."""

    def __init__(self) -> None:
        self._broker: Broker | None = None

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.debounce is not None

    def worker_start(self, worker: WorkerParts) -> None:
        self._broker = worker.app.broker

    def before_batch(self, jobs: list[Job]) -> None:
        keyed: list[tuple[Job, str]] = []
        for job in jobs:
            headers = job.message.headers
            key = headers.get(DEBOUNCE) if headers else None
            if isinstance(key, str) and not job.deferred:
                keyed.append((job, latest_name(job.message.queue, key)))
        if not keyed:
            return
        names = list(dict.fromkeys(name for _, name in keyed))
        assert self._broker is not None, "worker_start first"
        latest = dict(zip(names, self._broker.get_latest(names), strict=True))
        for job, name in keyed:
            by = latest[name]
            if by is not None and by != job.message.id:
                job.supersede(by)
