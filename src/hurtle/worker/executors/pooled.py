"""``PooledExecutor``: deliveries run by a ``RunnerPool``; the base of threads and greenlets.

The fetch loop may hold at most ``size + prefetch`` deliveries (running plus buffered), where
``size`` is the number of live runners and ``prefetch`` defaults to the same number: the local
buffer stays bounded and proportional to the pool, so a slow task never keeps a backlog of others
from idle workers. With ``min_concurrency < concurrency`` the pool scales itself: a batch that
finds no idle runner starts more (up to ``concurrency``), which widens the next fetch, and a
runner idle for a while retires (down to ``min_concurrency``).

Subclasses choose how runners start (``spawn``), how a time-limited call is stopped (``limit``),
whether a runner takes a share of a batch at once (``chunked``) and how many deliveries to hold
beyond one per runner (``ahead``).
"""

from __future__ import annotations

from typing import Any

from ...brokers import Delivery
from ...errors import ConfigurationError
from ..processor import Processor
from .base import Executor
from .runners import RunnerPool, Spawn, spawn_thread


class PooledExecutor(Executor):
    #: Runner names, for logs and thread dumps.
    runner_name = "hurtle-runner"
    #: True when each runner takes a share of a batch at once (``Processor.process_many``),
    #: False when it takes one delivery at a time (``Processor.process``).
    chunked = False

    def __init__(
        self,
        concurrency: int,
        *,
        min_concurrency: int | None = None,
        prefetch: int | None = None,
        spawn: Spawn = spawn_thread,
    ) -> None:
        low = concurrency if min_concurrency is None else min_concurrency
        if not 0 < low <= concurrency:
            raise ConfigurationError(
                f"concurrency must be at least 1 (and MIN <= MAX in MIN,MAX), got "
                f"{low},{concurrency}"
            )
        self.concurrency = concurrency
        self.min_concurrency = low
        self.prefetch = prefetch
        self.spawn = spawn
        self._pool: RunnerPool[Delivery] | None = None

    @property
    def pool(self) -> RunnerPool[Delivery]:
        assert self._pool is not None, "start() the executor first"
        return self._pool

    def start(self, processor: Processor) -> None:
        self._pool = RunnerPool(
            processor.process,
            max_size=self.concurrency,
            min_size=self.min_concurrency,
            spawn=self.spawn,
            name=self.runner_name,
            on_expire=processor.expire,
            on_error=processor.crashed,
            work_many=processor.process_many if self.chunked else None,
            tracker=processor.tracker,
        )
        self._pool.start()

    def ahead(self, pool: RunnerPool[Delivery]) -> int:
        """Deliveries to hold beyond one per runner: ``prefetch``, by default one more each."""
        return pool.size if self.prefetch is None else self.prefetch

    def wait_for_capacity(self, timeout: float) -> int:
        pool = self.pool

        def free() -> int:
            return pool.size + self.ahead(pool) - pool.outstanding()

        with pool.cond:
            pool.cond.wait_for(lambda: pool.stopping or free() > 0, timeout)
            return 0 if pool.stopping else max(free(), 0)

    def submit(self, deliveries: list[Delivery]) -> None:
        self.pool.submit(deliveries)

    def waiting(self) -> list[Delivery]:
        return self.pool.waiting()

    def idle(self) -> bool:
        pool = self.pool
        with pool.cond:
            return pool.outstanding() == 0

    def stop(self) -> list[Delivery]:
        return self.pool.stop()

    def join(self, timeout: float) -> bool:
        return self.pool.join(timeout)

    def abort(self) -> list[Delivery]:
        return self.pool.abort()

    def running(self) -> int:
        return 0 if self._pool is None else self._pool.running()

    def running_items(self) -> list[Any]:
        return [] if self._pool is None else self._pool.running_items()

    def abandoned(self) -> int:
        return self.pool.abandoned()
