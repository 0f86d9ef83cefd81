"""Which names the dashboard shows, so that names clients choose do not pile up in ``/metrics``
and the pages.

* Task labels: only the tasks the app registers get their own series and rows; every other name
  (messages of tasks the app does not know, which workers dead-letter) is counted under
  ``OTHER``. ``(undecodable)`` (bytes that were no message) stays as it is. A dashboard made
  from a broker knows no task: everything is ``OTHER``.
* Queues: ``IdleQueues`` forgets (``Broker.forget``) the queues it sees empty — nothing ready,
  delayed, in flight or dead, not paused — and unused — no live worker consumes them, the app's
  tasks do not name them — at every look for ``FORGET_AFTER`` seconds (an hour). It looks when
  the pages or ``/metrics`` read the queues, at most every ``SWEEP_EVERY`` seconds. A forgotten
  queue is known again with its next message; ``hurtle queue APP forget Q`` forgets one at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ..brokers import Broker, QueueStats
from ..brokers.reports import UNDECODABLE, TaskCounts, merge

#: The task label of every task name the app does not register.
OTHER = "(other)"
#: Seconds a queue stays empty and unused before the dashboard forgets it.
FORGET_AFTER = 3600.0
#: Most seconds between two looks for idle queues (less when ``forget_after`` is shorter).
SWEEP_EVERY = 60.0


def label(task: str, known: Collection[str]) -> str:
    """The label ``task`` is shown under: itself if the app registers it, else ``OTHER``."""
    return task if task in known or task == UNDECODABLE else OTHER


def fold_counts(counts: Iterable[TaskCounts], known: Collection[str]) -> list[TaskCounts]:
    """Counters per (queue, task label), summed, sorted."""
    return merge(
        c if label(c.task, known) == c.task else TaskCounts(c.queue, OTHER, *_counters(c))
        for c in counts
    )


def _counters(c: TaskCounts) -> tuple[int, int, int, int]:
    return c.processed, c.failed, c.retried, c.dead_lettered


def fold_histograms(rows: Iterable[dict[str, Any]], known: Collection[str]) -> list[dict[str, Any]]:
    """``queries.runtime_histograms`` rows per (queue, task label), summed."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["queue"], label(row["task"], known))
        into = out.get(key)
        if into is None:
            out[key] = {**row, "task": key[1], "counts": list(row["counts"])}
        else:
            into["counts"] = [a + b for a, b in zip(into["counts"], row["counts"], strict=True)]
            into["sum"] += row["sum"]
    return [out[k] for k in sorted(out)]


class IdleQueues:
    """Forgets queues seen empty and unused for ``after`` seconds (0: never)."""

    def __init__(self, broker: Broker, declared: Iterable[str] = (), after: float = FORGET_AFTER):
        self.broker = broker
        self.declared = frozenset(declared)
        self.after = after
        self.every = min(SWEEP_EVERY, after / 4)
        self._since: dict[str, float] = {}  # queue -> when it was first seen idle, in a row
        self._looked = float("-inf")
        self._lock = threading.Lock()

    def sweep(self, stats: Mapping[str, QueueStats]) -> dict[str, QueueStats]:
        """``stats`` (of every known queue, just read) less the queues forgotten now."""
        now = time.monotonic()
        if not self.after or now - self._looked < self.every:
            return dict(stats)
        with self._lock:
            self._looked = now
            in_use = self.declared.union(*(w.queues for w in self.broker.workers()))
            idle = QueueStats()
            since = self._since
            for name in set(since) - set(stats):
                del since[name]
            gone = set()
            for name, s in stats.items():
                if s != idle or name in in_use:
                    since.pop(name, None)
                elif now - since.setdefault(name, now) >= self.after and self.broker.forget(name):
                    del since[name]
                    gone.add(name)
        return {name: s for name, s in stats.items() if name not in gone}
