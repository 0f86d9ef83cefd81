"""Celery 5 side of the benchmark: ``bench.add`` on a Redis broker, all Celery defaults (no
result backend, prefetch multiplier 4, acknowledged on receipt); published with ``delay()``."""

from __future__ import annotations

import os
from collections.abc import Callable

from celery import Celery

from ..harness.probe import hit
from . import one_by_one

app = Celery("bench", broker=os.environ["HURTLE_BENCH_REDIS_URL"])


@app.task(name="bench.add")
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    return one_by_one(add.delay, count, progress)
