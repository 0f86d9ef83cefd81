"""The hurtle side of the benchmark: ``bench.add`` on an app whose broker comes from
``HURTLE_BROKER_URL``; published with ``send_many`` in batches of ``BATCH`` (to the default
queue, or in turn to each of ``SPREAD`` with ``publish_spread``)."""

from __future__ import annotations

from collections.abc import Callable

from ...app import Hurtle
from ..harness.probe import hit

BATCH = 1000
#: Three queues whose hash tags fall in the three thirds of the slots, so that on a cluster
#: made by ``redis-cli --cluster create`` with three masters each queue has a master of its own.
SPREAD = ("bench-0", "bench-2", "bench-3")

app = Hurtle(heartbeat_timeout=10)


@app.task(name="bench.add")
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    sent = 0
    while sent < count:
        n = min(BATCH, count - sent)
        add.send_many([(5, 6)] * n)
        sent += n
        progress(sent)
    app.close()
    return sent


def publish_spread(count: int, progress: Callable[[int], None]) -> int:
    sent = 0
    bound = [add.options(queue=q) for q in SPREAD]
    turn = 0
    while sent < count:
        n = min(BATCH, count - sent)
        bound[turn % len(bound)].send_many([(5, 6)] * n)
        turn += 1
        sent += n
        progress(sent)
    app.close()
    return sent
