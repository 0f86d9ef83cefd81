"""``Summary``: what a ``drain`` (or an ``eager`` block, so far) ran, counted by its workers.

The counts are the workers' own tallies (``hurtle.brokers.reports``), the ones a worker sends with
its heartbeats: ``ran`` counts the messages taken in hand whatever came of them, ``failed`` the
calls that raised (or messages that could not run: unknown task, expired, cancelled), ``retried``
and ``dead`` what those failures led to. A call retried twice then successful counts three times
in ``ran``, twice in ``failed`` and ``retried``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..brokers.reports import TaskCounts

if TYPE_CHECKING:
    from ..task import Task


@dataclasses.dataclass
class Summary:
    """Counts summed over tasks and queues; ``counts`` has them per (queue, task)."""

    ran: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    counts: dict[tuple[str, str], TaskCounts] = dataclasses.field(default_factory=dict)

    def add(self, snapshot: dict[tuple[str, str], tuple[int, int, int, int]]) -> None:
        """Add a worker's tally (``Tally.snapshot()``)."""
        for (queue, task), (ran, failed, retried, dead) in snapshot.items():
            self.ran += ran
            self.failed += failed
            self.retried += retried
            self.dead += dead
            was = self.counts.get((queue, task), TaskCounts(queue, task))
            self.counts[(queue, task)] = TaskCounts(
                queue,
                task,
                was.processed + ran,
                was.failed + failed,
                was.retried + retried,
                was.dead_lettered + dead,
            )

    def task(self, task: Task[Any, Any] | str) -> TaskCounts:
        """The counts of ``task`` (or of the task of that name), over every queue."""
        name = task if isinstance(task, str) else task.name
        out = TaskCounts("*", name)
        for (_, task), c in self.counts.items():
            if task == name:
                out = TaskCounts(
                    "*",
                    name,
                    out.processed + c.processed,
                    out.failed + c.failed,
                    out.retried + c.retried,
                    out.dead_lettered + c.dead_lettered,
                )
        return out

    def __repr__(self) -> str:
        return (
            f"Summary(ran={self.ran}, failed={self.failed}, retried={self.retried}, "
            f"dead={self.dead})"
        )
