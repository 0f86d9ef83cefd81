"""Celery 5 side of the benchmark: ``bench.add`` on a Redis broker, all Celery defaults (no
result backend, prefetch multiplier 4, acknowledged on receipt); published with ``delay()``."""

from __future__ import annotations

import os
from collections.abc import Callable

from celery import Celery

from ..probe import hit

app = Celery("bench", broker=os.environ["HURTLE_BENCH_REDIS_URL"])


@app.task(name="bench.add")
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    for i in range(1, count + 1):
        add.delay(5, 6)
        if not i % 1000:
            progress(i)
    return count
