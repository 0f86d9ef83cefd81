"""Huey side of the benchmark: a ``RedisHuey`` task with Huey's defaults (results stored);
published by calling the task; consumed by ``huey_consumer`` (one worker thread by default)."""

from __future__ import annotations

import os
from collections.abc import Callable

from huey import RedisHuey

from ..harness.probe import hit
from . import one_by_one

huey = RedisHuey("bench", url=os.environ["HURTLE_BENCH_REDIS_URL"])


@huey.task()
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    return one_by_one(add, count, progress)
