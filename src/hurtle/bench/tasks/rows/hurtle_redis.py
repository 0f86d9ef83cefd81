"""Rows ``hurtle-redis-*``: hurtle on one Redis, solo, threads, and three queues with a worker
process each."""

from __future__ import annotations

from ...harness.scenario import PY
from ..common import LOCK, hurtle_row

#: Three worker processes, each reading one of the three queues of ``hurtle_app.SPREAD`` (one
#: per master of a 3-master cluster). Also the worker of ``hurtle-cluster-3q``.
THREE_WORKERS = (
    "sh",
    "-c",
    " & ".join(
        f"{PY} -m hurtle --log-level WARNING worker hurtle.bench.peers.hurtle_app:app "
        f"--pool solo -Q {queue}"
        for queue in ("bench-0", "bench-2", "bench-3")
    )
    + " & wait",
)

ROWS = [
    hurtle_row("hurtle-redis-solo", "solo pool, concurrency 1", "--pool", "solo"),
    hurtle_row(
        "hurtle-redis-threads",
        "threads pool, concurrency 10",
        "--pool",
        "threads",
        "--concurrency",
        "10",
        env=LOCK,
    ),
    hurtle_row(
        "hurtle-redis-3q",
        "3 queues, 3 solo worker processes (one per queue)",
        publish="publish_spread",
        worker=THREE_WORKERS,
    ),
]
