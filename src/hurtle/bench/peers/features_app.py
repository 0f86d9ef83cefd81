"""The app of ``hurtle bench features``: ``bench.add`` registered with the task options in
``$HURTLE_BENCH_OPTIONS`` (JSON), published with ``send_many`` in batches of ``BATCH`` (with
the per-call options of ``$HURTLE_BENCH_SEND``, if any). Calls have distinct arguments
(``add(i, 6)``), so that ``unique_for`` keeps every one of them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from ...app import Hurtle
from ...context import current
from ..harness.probe import hit

BATCH = 1000

app = Hurtle(heartbeat_timeout=10)


def add(x: int, y: int) -> int:
    hit()
    return x + y


def add_reporting(x: int, y: int) -> int:
    """``add`` that reports its progress (the ``progress`` row)."""
    hit()
    current().progress(0.5, "half way")
    return x + y


task = app.task(name="bench.add", **json.loads(os.environ.get("HURTLE_BENCH_OPTIONS", "{}")))(
    add_reporting if os.environ.get("HURTLE_BENCH_CALLS") == "progress" else add
)


#: Per-call options of the sends (``$HURTLE_BENCH_SEND``, JSON), such as a ``delay``.
SEND = json.loads(os.environ.get("HURTLE_BENCH_SEND") or "{}")


def publish(count: int, progress: Callable[[int], None]) -> int:
    sender = task.options(**SEND) if SEND else task
    sent = 0
    while sent < count:
        n = min(BATCH, count - sent)
        sender.send_many([(i, 6) for i in range(sent, sent + n)])
        sent += n
        progress(sent)
    app.close()
    return sent
