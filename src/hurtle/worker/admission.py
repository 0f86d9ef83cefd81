"""What a batch's middleware decide before its calls run, and see after: ``admit`` (by counts),
``superseded`` (by the messages) and ``before_batch`` (by the jobs) set calls aside — deferred,
or settled unrun as replaced by later ones — and ``after_batch`` sees the jobs settled. A mixin
of the batch path (``batch.BatchPath``), whose loops call these once per batch."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .._text import describe, safe_repr
from ..brokers import Delivery
from ..message import Message
from ..middleware import Job, Middleware, Pipeline, overrides
from .unrun import NotRun

if TYPE_CHECKING:
    from ..task import Task

log = logging.getLogger("hurtle.worker.processor")  # the name these lines were always logged under
#: Seconds the jobs of a batch wait in their queue when a ``before_batch`` hook failed.
BEFORE_BATCH_PAUSE = 1.0


class Admission(NotRun):
    if TYPE_CHECKING:  # what it uses of the ``Processor`` it is mixed into
        _pipelines: dict[str, Pipeline]

    def _admit(
        self,
        counted: dict[Pipeline, list[int]],
        runnable: list[Delivery],
        items: list[Message | Job],
    ) -> None:
        """Ask each ``admit`` middleware about its tasks' counts, once for the batch, and
        mark for deferral the items beyond what it admits (a ``Job`` made for those only)."""
        by_middleware: dict[Middleware, dict[Task[Any, Any], int]] = {}
        for pipeline, where in counted.items():
            for m in pipeline.admits:
                by_middleware.setdefault(m, {})[pipeline.task] = len(where)
        pipelines = {p.task.name: p for p in counted}
        for m, counts in by_middleware.items():
            try:
                verdicts = m.admit(counts)
            except Exception as err:  # (the broker is unreachable...) run none of them now
                log.error(
                    "middleware %s failed in admit: %s; its %d jobs go back to their queue for %gs",
                    safe_repr(m),
                    describe(err),
                    sum(counts.values()),
                    BEFORE_BATCH_PAUSE,
                )
                verdicts = {t.name: (0, BEFORE_BATCH_PAUSE, 0.0, "admit failed") for t in counts}
            for name, (admitted, wait, step, reason) in verdicts.items():
                pipeline = pipelines[name]
                left = [at for at in counted[pipeline] if not _deferred(items[at])]
                for i, at in enumerate(left[max(admitted, 0) :]):  # in the order they came
                    item = items[at]
                    job = (
                        item
                        if isinstance(item, Job)
                        else Job(runnable[at], item, pipeline.task, pipeline, batch=True)
                    )
                    job.defer(wait + i * step, reason)
                    items[at] = job

    def _screen(
        self,
        screened: dict[Pipeline, list[int]],
        runnable: list[Delivery],
        items: list[Message | Job],
    ) -> None:
        """Show each ``superseded`` middleware the messages of its tasks, once for the batch,
        and mark the calls it says were replaced (a ``Job`` made for those only); when it
        fails, its messages go back to their queue for a while, as with ``before_batch``."""
        by_middleware: dict[Middleware, list[int]] = {}
        for pipeline, where in screened.items():
            for m in pipeline.screens:
                by_middleware.setdefault(m, []).extend(where)
        for m, where in by_middleware.items():
            messages: list[Message] = [
                it.message if type(it) is Job else it  # type: ignore[misc]
                for it in map(items.__getitem__, where)
            ]
            try:
                verdicts = m.superseded(messages)
            except Exception as err:  # (the broker is unreachable...) run none of them now
                log.error(
                    "middleware %s failed in superseded: %s; its %d jobs go back to their "
                    "queue for %gs",
                    safe_repr(m),
                    describe(err),
                    len(where),
                    BEFORE_BATCH_PAUSE,
                )
                for at in where:
                    job = self._job_at(items, runnable, at)
                    if not (job.deferred or job.superseded):
                        job.defer(BEFORE_BATCH_PAUSE, "superseded failed")
                continue
            for i, by in verdicts.items():
                job = self._job_at(items, runnable, where[i])
                if not (job.deferred or job.superseded):
                    job.supersede(by)

    def _job_at(self, items: list[Message | Job], runnable: list[Delivery], at: int) -> Job:
        """The ``Job`` of item ``at``, made (and put in its place) if it is a plain message."""
        item = items[at]
        if type(item) is Job:
            return item
        message: Message = item  # type: ignore[assignment]
        pipeline = self._pipelines[message.task]
        job = items[at] = Job(runnable[at], message, pipeline.task, pipeline, batch=True)
        return job

    def _before_batch(self, groups: dict[Middleware, list[Job]]) -> None:
        for m, jobs in groups.items():
            if not overrides(m, "before_batch"):
                continue
            try:
                m.before_batch(jobs)
            except Exception as err:  # (the broker is unreachable...) run none of them now
                log.error(
                    "middleware %s failed in before_batch: %s; its %d jobs go back to "
                    "their queue for %gs",
                    safe_repr(m),
                    describe(err),
                    len(jobs),
                    BEFORE_BATCH_PAUSE,
                )
                for job in jobs:
                    if not job.deferred:
                        job.defer(BEFORE_BATCH_PAUSE, "before_batch failed")

    def _after_batch(self, groups: dict[Middleware, list[Job]]) -> None:
        for m, jobs in groups.items():
            if not overrides(m, "after_batch"):
                continue
            settled = [j for j in jobs if j.outcome is not None]
            if not settled:
                continue
            try:
                m.after_batch(settled)
            except Exception as err:
                log.error("middleware %s failed in after_batch: %s", safe_repr(m), describe(err))


def _deferred(item: Message | Job) -> bool:
    return type(item) is Job and item.deferred


def _set_aside(item: Message | Job) -> bool:
    """True for a job deferred or superseded by ``before_batch``: it does not run now."""
    return type(item) is Job and (item.deferred or bool(item.superseded))
