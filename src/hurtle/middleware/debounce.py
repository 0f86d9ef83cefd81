"""Debounced tasks (``debounce=``): the worker's side, one broker read per batch.

A debounced call is published due ``debounce`` seconds after its send and recorded as the
latest of its key (``hurtle.debounce``, ``sending.publish_latest``). Before a fetched batch
runs (``superseded``: read in columns, no ``Job`` per message), the latest records of the keys
its debounced messages name that are not their own calls' are read in one
``Broker.get_other_latest`` call (none, in the usual batch); a message whose key's record names
another call made no earlier than itself (``debounce.superseded_by``) was replaced by a later
call and is settled without running (``Job.supersede``: acknowledged, its unique lock released,
a ``superseded`` record for a task that keeps results). A key with no record (it expired, or
the send that published the message failed before recording it) runs its message.

A consumer that tells the queues none of whose calls had been replaced when it fetched
(``Consumer.unreplaced``: Redis's fetch script reads a flag that a record replacing another
call's raises) spares the read for a batch of those queues: no record there names another call.

Only tasks registered with ``debounce=`` get this middleware: a batch without their messages
makes no call, and their calls cost a look at their headers and a share of one read per batch
(a ``Job`` only for a call superseded, or met outside a batch: ``before_batch``).
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..debounce import DEBOUNCE, superseded_by
from ..message import Message
from . import Job, Middleware, WorkerParts

if TYPE_CHECKING:
    from ..brokers import Broker, Consumer
    from ..task import Task


_ID = attrgetter("id")
_QUEUE = attrgetter("queue")


class DebounceMiddleware(Middleware):
    """Settles, unrun, the debounced calls that later calls of their keys replaced."""

    def __init__(self) -> None:
        self._broker: Broker | None = None
        self._consumer: Consumer | None = None

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return task.debounce is not None

    def worker_start(self, worker: WorkerParts) -> None:
        self._broker = worker.app.broker
        self._consumer = worker.consumer

    def reads_before_calls(self) -> bool:
        """False while the worker's consumer says none of its queues had a call replaced."""
        consumer = self._consumer
        return consumer is None or not consumer.unreplaced.issuperset(consumer.queues)

    def superseded(self, messages: list[Message]) -> dict[int, str]:
        """The batch path's check, in columns: no ``Job`` per message, one
        ``get_other_latest`` per queue (a batch is mostly one), which answers only for keys
        whose record is not their call's own: a batch none of whose calls was replaced comes
        back empty, and only what it sends back is compared here (``superseded_by``).
        Nothing, without a broker call, when the worker's consumer says no call of the
        batch's queues was replaced by the time it fetched them (``Consumer.unreplaced``)."""
        consumer = self._consumer
        if (
            consumer is not None
            and (unreplaced := consumer.unreplaced)
            and unreplaced.issuperset(map(_QUEUE, messages))
        ):
            return {}
        keys = [h.get(DEBOUNCE) if (h := m.headers) else None for m in messages]
        queues = {m.queue for m in messages}
        assert self._broker is not None, "worker_start first"
        out: dict[int, str] = {}
        if len(queues) == 1 and None not in keys:  # the usual batch
            found = self._broker.get_other_latest(
                messages[0].queue,
                keys,  # type: ignore[arg-type]
                list(map(_ID, messages)),
            )
            at: list[int] | range = range(len(messages))
        else:
            found, at = {}, []
            for queue in queues:
                mine = [
                    i
                    for i, (m, key) in enumerate(zip(messages, keys, strict=True))
                    if m.queue == queue and type(key) is str
                ]
                if mine:
                    other = self._broker.get_other_latest(
                        queue,
                        [keys[i] for i in mine],  # type: ignore[misc]
                        [messages[i].id for i in mine],
                    )
                    found.update({len(at) + i: value for i, value in other.items()})
                    at += mine
        for i, value in found.items():
            m = messages[at[i]]
            by = superseded_by(value, m.id, m.created)
            if by is not None:
                out[at[i]] = by
        return out

    def before_batch(self, jobs: list[Job]) -> None:
        """A job met outside a batch (``superseded`` serves batches)."""
        live = [job for job in jobs if not job.deferred]
        for i, by in self.superseded([job.message for job in live]).items():
            live[i].supersede(by)
