"""The messages a processor does not run: undecodable, of an unknown task, expired or cancelled
before they started, or that crashed the worker's own handling. Each is counted, dead-lettered
with its reason and, for a task that keeps results or a workflow member, given its record.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .._text import describe, trace
from ..brokers import Delivery
from ..brokers.reports import UNDECODABLE, Tally
from ..errors import DecodeError
from ..message import Message
from ..middleware.results import CANCELLED, EXPIRED, encode_skipped
from . import flows

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..task import Task
    from .acker import Acker

# Counter indexes of a ``Tally`` (``brokers/reports.py``).
PROCESSED, FAILED, RETRIED, DEAD_LETTERED = range(4)

log = logging.getLogger("hurtle.worker.processor")  # the name these lines were always logged under
_decode = Message.decode


class NotRun:
    if TYPE_CHECKING:  # what it uses of the ``Processor`` it is mixed into
        acker: Acker
        app: Hurtle
        failed: int
        processed: int
        tally: Tally
        tasks: dict[str, Task[Any, Any]]

    def crashed(self, delivery: Delivery, err: BaseException) -> None:
        """Dead-letter a delivery whose handling failed unexpectedly (the last resort)."""
        self.failed += 1
        self._count_lost(delivery, FAILED)
        self._crashed(delivery, err)

    def _crashed(self, delivery: Delivery, err: BaseException) -> None:
        reason = (
            f"the worker could not handle this message ({describe(err)}); it is kept here "
            f"instead of being retried, since it would fail the same way:\n{trace(err)}"
        )
        log.error(
            "dead-lettering a message of %r that could not be handled: %s",
            delivery.queue,
            describe(err),
        )
        self._count_lost(delivery, DEAD_LETTERED)
        self.acker.dead_letter(delivery, reason)

    def _undecodable(self, delivery: Delivery, err: Exception) -> None:
        self.failed += 1
        for kind in (PROCESSED, FAILED, DEAD_LETTERED):
            self.tally.add(delivery.queue, UNDECODABLE, kind)
        text = str(err) if isinstance(err, DecodeError) else describe(err)
        log.error("dead-lettering an undecodable message from %r: %s", delivery.queue, text)
        self.acker.dead_letter(delivery, f"undecodable message: {text}")

    def _too_late(
        self, delivery: Delivery, message: Message, late: list[tuple[Delivery, str]] | None = None
    ) -> None:
        """A message whose expiry time passed before it started: not run; a dead letter with
        the reason ``expired`` (added to ``late``, which the batch hands to the acker at its end,
        else handed over now) and, when its task keeps results, an ``expired`` record."""
        self.processed += 1
        self.tally.add(delivery.queue, message.task, PROCESSED)
        self.tally.add(delivery.queue, message.task, DEAD_LETTERED)
        log.debug(
            "task %s[%s] expired %.3gs before it could start: not run",
            message.task,
            message.id,
            time.time() - message.expires,
        )
        task = self.tasks.get(message.task)
        if task is not None and task.store_result:
            self.acker.store_result(
                message.id,
                encode_skipped(EXPIRED, "not started before its expiry time", message),
                task.result_ttl,
            )
        if late is None:
            self.acker.dead_letter_many([(delivery, EXPIRED)])
        else:
            late.append((delivery, EXPIRED))

    def cancelled(self, deliveries: list[Delivery]) -> None:
        """Record cancelled deliveries without running them: dead letters ``cancelled`` (one
        broker call for all) and, for tasks that keep results, ``cancelled`` records."""
        for delivery in deliveries:
            self.processed += 1
            try:
                message = _decode(delivery.raw)
            except Exception:  # its id was read, the rest is not a message: counted as such
                name = UNDECODABLE
            else:
                name = message.task
                task = self.tasks.get(name)
                if task is not None and task.store_result:
                    self.acker.store_result(
                        message.id,
                        encode_skipped(CANCELLED, "cancelled before it started", message),
                        task.result_ttl,
                    )
            self.tally.add(delivery.queue, name, PROCESSED)
            self.tally.add(delivery.queue, name, DEAD_LETTERED)
        log.info("%d cancelled messages not run", len(deliveries))
        self.acker.dead_letter_many([(d, CANCELLED) for d in deliveries])

    def _unknown(self, delivery: Delivery, message: Message) -> None:
        self.failed += 1
        for kind in (PROCESSED, FAILED, DEAD_LETTERED):
            self.tally.add(delivery.queue, message.task, kind)
        reason = (
            f"unknown task {message.task!r}: this worker's app registers no task of that "
            "name; deploy the code that defines it, then retry the dead letter"
        )
        log.error("dead-lettering message %s: %s", message.id, reason)
        if flows.is_flow(message) and (record := flows.unknown_failure(message, reason, self.app)):
            self.acker.store_result(record.id, record.payload, record.ttl)
        self.acker.dead_letter(delivery, reason)

    def _count_lost(self, delivery: Delivery, kind: int) -> None:
        """Count an outcome of a delivery whose task is not at hand (a rare, slow path)."""
        try:
            task = _decode(delivery.raw).task
        except Exception:
            task = UNDECODABLE
        self.tally.add(delivery.queue, task, kind)
