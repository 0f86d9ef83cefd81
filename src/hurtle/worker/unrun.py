"""The messages a processor does not run: undecodable, of an unknown task, expired or cancelled
before they started, or that crashed the worker's own handling. Each is counted and
dead-lettered with its reason; ``_bury`` — the one place every dead letter of the processor goes
through, run or not — first hands the acker what ends with it (``ends.ending``: its result
record, its workflow's, its unique lock).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .._text import describe, trace
from ..brokers import Delivery, Lock, StoredResult
from ..brokers.reports import UNDECODABLE, Tally
from ..debounce import DEBOUNCE
from ..errors import DecodeError
from ..message import Message, lock_of, salvage
from ..records import CANCELLED, DEAD, EXPIRED, encode_superseded
from .ends import ending

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..middleware import Job
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

    def _bury(
        self,
        delivery: Delivery,
        message: Message | None,
        reason: str,
        *,
        state: str = DEAD,
        why: str = "",
        error: BaseException | None = None,
        job: Job | None = None,
        late: list[tuple[Delivery, str]] | None = None,
    ) -> None:
        """Dead-letter ``delivery`` with ``reason``, after handing the acker what ends with it
        (``ends.ending`` of ``message``, or of what ``salvage`` reads of bytes that did not
        decode): records first, so that none lands after the dead letter. ``late`` gathers the
        dead letter for one call at the batch's end (else it is handed over now)."""
        if message is None:
            message = salvage(delivery.raw)
        if message is not None:
            try:
                records, lock = ending(
                    self.app,
                    delivery.queue,
                    message,
                    why or reason,
                    state=state,
                    error=error,
                    job=job,
                )
            except Exception as err:  # never in the way of the dead letter itself
                log.error("could not record the end of message %s: %s", message.id, describe(err))
            else:
                for r in records:
                    self.acker.store_result(r.id, r.payload, r.ttl)
                if lock is not None:
                    self.acker.end_unique(*lock)
        if late is not None:
            late.append((delivery, reason))
        else:
            self.acker.dead_letter(delivery, reason)

    def ends_of(
        self, delivery: Delivery, message: Message, reason: str
    ) -> tuple[list[StoredResult], Lock | None]:
        """What ends with ``message`` when it becomes a dead letter for ``reason`` outside the
        processor (a retry the broker refused to schedule: ``Acker.ends``)."""
        return ending(self.app, delivery.queue, message, reason)

    def crashed(self, delivery: Delivery, err: BaseException) -> None:
        """Dead-letter a delivery whose handling failed unexpectedly (the last resort)."""
        self.failed += 1
        self._count_lost(delivery, FAILED)
        self._crashed(delivery, err)

    def _crashed(
        self, delivery: Delivery, err: BaseException, job: Job | None = None, ended: bool = False
    ) -> None:
        """``crashed`` without the failure count; ``ended`` when what ends with the message was
        handed over already (only the dead letter is left to record)."""
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
        if ended:
            self.acker.dead_letter(delivery, reason)
            return
        message = job.message if job is not None else None
        if message is None:
            try:
                message = _decode(delivery.raw)
            except Exception:
                message = None
        self._bury(delivery, message, reason, error=err, job=job)

    def _undecodable(self, delivery: Delivery, err: Exception) -> None:
        self.failed += 1
        for kind in (PROCESSED, FAILED, DEAD_LETTERED):
            self.tally.add(delivery.queue, UNDECODABLE, kind)
        text = str(err) if isinstance(err, DecodeError) else describe(err)
        log.error("dead-lettering an undecodable message from %r: %s", delivery.queue, text)
        self._bury(delivery, None, f"undecodable message: {text}", error=err)

    def _too_late(
        self, delivery: Delivery, message: Message, late: list[tuple[Delivery, str]] | None = None
    ) -> None:
        """A message whose expiry time passed before it started: not run; a dead letter with
        the reason ``expired`` (added to ``late``, which the batch hands to the acker at its end,
        else handed over now), and ``expired`` records (its own, its workflow's)."""
        self.processed += 1
        self.tally.add(delivery.queue, message.task, PROCESSED)
        self.tally.add(delivery.queue, message.task, DEAD_LETTERED)
        log.debug(
            "task %s[%s] expired %.3gs before it could start: not run",
            message.task,
            message.id,
            time.time() - message.expires,
        )
        batch: list[tuple[Delivery, str]] = [] if late is None else late
        self._bury(
            delivery,
            message,
            EXPIRED,
            state=EXPIRED,
            why="not started before its expiry time",
            late=batch,
        )
        if late is None:
            self.acker.dead_letter_many(batch)

    def cancelled(self, deliveries: list[Delivery]) -> None:
        """Record cancelled deliveries without running them: dead letters ``cancelled`` (one
        broker call for all), and ``cancelled`` records (their own, their workflows')."""
        late: list[tuple[Delivery, str]] = []
        for delivery in deliveries:
            self.processed += 1
            try:
                message: Message | None = _decode(delivery.raw)
            except Exception:  # its id was read, the rest is not a message: counted as such
                message = None
            name = UNDECODABLE if message is None else message.task
            self.tally.add(delivery.queue, name, PROCESSED)
            self.tally.add(delivery.queue, name, DEAD_LETTERED)
            self._bury(
                delivery,
                message,
                CANCELLED,
                state=CANCELLED,
                why="cancelled before it started",
                late=late,
            )
        log.info("%d cancelled messages not run", len(deliveries))
        self.acker.dead_letter_many(late)

    #: Debounced messages settled without running: a later call of their key replaced them.
    debounced = 0

    def superseded(self, jobs: list[Job]) -> None:
        """Settle debounced jobs that later calls of their keys replaced (``Job.supersede``),
        without running them: acknowledged (each with a ``superseded`` record, naming the call
        that replaced it, when its task keeps results), their unique locks released; counted as
        processed, and in ``debounced``."""
        plain: list[Delivery] = []
        kept: list[Delivery] = []
        records: list[StoredResult] = []
        locks: list[Lock] = []
        for job in jobs:
            delivery, message, task = job.delivery, job.message, job.task
            self.processed += 1
            self.tally.add(delivery.queue, task.name, PROCESSED)
            if task.store_result:
                key = str(message.headers.get(DEBOUNCE, "")) if message.headers else ""
                kept.append(delivery)
                records.append(
                    StoredResult(
                        message.id,
                        encode_superseded(message, job.superseded, key),
                        task.result_ttl,
                    )
                )
            else:
                plain.append(delivery)
            lock = lock_of(message)
            if lock is not None:
                locks.append((delivery.queue, lock[0], message.id, lock[1]))
        self.debounced += len(jobs)
        log.debug("%d debounced calls superseded by later ones: not run", len(jobs))
        if plain:
            self.acker.ack_many(plain)
        if kept:
            self.acker.ack_many_with_results(kept, records)
        if locks:
            self.acker.release_uniques(locks)

    def _unknown(self, delivery: Delivery, message: Message) -> None:
        self.failed += 1
        for kind in (PROCESSED, FAILED, DEAD_LETTERED):
            self.tally.add(delivery.queue, message.task, kind)
        reason = (
            f"unknown task {message.task!r}: this worker's app registers no task of that "
            "name; deploy the code that defines it, then retry the dead letter"
        )
        log.error("dead-lettering message %s: %s", message.id, reason)
        self._bury(delivery, message, reason)

    def _count_lost(self, delivery: Delivery, kind: int) -> None:
        """Count an outcome of a delivery whose task is not at hand (a rare, slow path)."""
        try:
            task = _decode(delivery.raw).task
        except Exception:
            task = UNDECODABLE
        self.tally.add(delivery.queue, task, kind)
