"""``threads``: a pool of threads, for tasks that wait on I/O.

Each thread runs a share of a fetched batch at once (``RunnerPool`` chunks, through
``Processor.process_many``), so short tasks pay no hand-off between threads each, and the fetch
window grows with how fast tasks go: about ``target_batch_seconds`` of work beyond one per
thread, at least one more per thread (as other pools), at most ``max_batch``. A slow task holds up
nothing: idle threads take the unstarted rest of its chunk.

A thread cannot be interrupted, so a call that overruns its time limit is failed by the pool's
watchdog, and its thread abandoned and replaced (``RunnerPool.limit``); the rest of its chunk
goes to the other threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...brokers import Delivery
from ..processor import Job
from .pooled import PooledExecutor
from .runners import RunnerPool


class ThreadsExecutor(PooledExecutor):
    runner_name = "hurtle-thread"
    chunked = True

    def __init__(
        self,
        concurrency: int,
        *,
        min_concurrency: int | None = None,
        max_batch: int = 1000,
        target_batch_seconds: float = 0.05,
    ) -> None:
        super().__init__(concurrency, min_concurrency=min_concurrency)
        self.max_batch = max_batch
        self.target = target_batch_seconds

    def ahead(self, pool: RunnerPool[Delivery]) -> int:
        """About ``target_batch_seconds`` of work at the measured pace, at least one more per
        thread, at most ``max_batch``."""
        size = pool.size
        return min(max(int(self.target / max(pool.per_item, 1e-7)), size), self.max_batch)

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        return self.pool.limit(job, call)
