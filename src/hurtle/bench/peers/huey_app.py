"""Huey side of the benchmark: a ``RedisHuey`` task with Huey's defaults (results stored);
published by calling the task; consumed by ``huey_consumer`` (one worker thread by default)."""

from __future__ import annotations

import os
from collections.abc import Callable

from huey import RedisHuey

from ..probe import hit

huey = RedisHuey("bench", url=os.environ["HURTLE_BENCH_REDIS_URL"])


@huey.task()
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    for i in range(1, count + 1):
        add(5, 6)
        if not i % 1000:
            progress(i)
    return count
