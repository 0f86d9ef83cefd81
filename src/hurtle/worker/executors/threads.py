"""``threads``: a pool of threads, for tasks that wait on I/O.

Everything but time limits is ``PooledExecutor``'s. A thread cannot be interrupted, so a call
that overruns its time limit is failed by the pool's watchdog, and its thread abandoned and
replaced (``RunnerPool.limit``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..processor import Job
from .pooled import PooledExecutor


class ThreadsExecutor(PooledExecutor):
    runner_name = "hurtle-thread"

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        return self.pool.limit(job, call)
