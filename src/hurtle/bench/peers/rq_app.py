"""RQ side of the benchmark: ``add`` enqueued one job at a time on queue ``bench``; consumed by
``rq worker`` with its default worker class (a fork per job)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from rq import Queue

from redis import Redis

from ..harness.probe import hit
from . import one_by_one


def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    queue = Queue("bench", connection=Redis.from_url(os.environ["HURTLE_BENCH_REDIS_URL"]))
    return one_by_one(functools.partial(queue.enqueue, add), count, progress)
