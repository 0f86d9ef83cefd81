"""funboost side of the benchmark: one ``@boost`` function on the broker kind named by
``HURTLE_BENCH_FUNBOOST_KIND`` (``REDIS`` or ``REDIS_ACK_ABLE``), single-threaded; published
with ``push()``. ``python -m hurtle.bench.peers.funboost_app`` consumes until stopped.

funboost reads ``funboost_config.py`` and ``nb_log_config.py`` from ``sys.path`` (and writes
them there when absent): ``tasks.rows.funboost`` writes both into the row's work directory
first.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from funboost import (
    BoosterParams,
    BrokerEnum,
    ConcurrentModeEnum,
    boost,
)

from ..harness.probe import hit
from . import one_by_one

KIND = os.environ.get("HURTLE_BENCH_FUNBOOST_KIND", "REDIS")


@boost(
    BoosterParams(
        queue_name=f"bench_funboost_{KIND.lower()}",
        broker_kind=getattr(BrokerEnum, KIND),
        concurrent_mode=ConcurrentModeEnum.SINGLE_THREAD,
        concurrent_num=1,
        log_level=logging.WARNING,
        create_logger_file=False,
    )
)
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    return one_by_one(add.push, count, progress)


if __name__ == "__main__":
    add.consume()
    while True:
        time.sleep(3600)
