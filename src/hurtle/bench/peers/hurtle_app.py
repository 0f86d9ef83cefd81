"""The hurtle side of the benchmark: ``bench.add`` on an app whose broker comes from
``HURTLE_BROKER_URL``; published with ``send_many`` in batches of ``BATCH``."""

from __future__ import annotations

from collections.abc import Callable

from ...app import Hurtle
from ..probe import hit

BATCH = 1000

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
