"""Dramatiq side of the benchmark: an actor on its Redis broker with the default middleware;
published with ``send()``; consumed by ``dramatiq`` with its default processes and threads."""

from __future__ import annotations

import os
from collections.abc import Callable

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from ..harness.probe import hit
from . import one_by_one

broker = RedisBroker(url=os.environ["HURTLE_BENCH_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", actor_name="bench_add")
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    return one_by_one(add.send, count, progress)
