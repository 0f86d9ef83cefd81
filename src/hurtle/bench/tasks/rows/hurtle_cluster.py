"""Rows ``hurtle-cluster-*``: hurtle on the Redis Cluster of ``--broker-url redis+cluster://``
(skipped without one): solo, solo with ``?wait_replicas=1``, and three queues on three masters."""

from __future__ import annotations

from ..common import hurtle_row
from .hurtle_redis import THREE_WORKERS

CLUSTER = (
    "a Redis Cluster: hurtle bench tasks --broker-url redis+cluster://host:port (any node; "
    "the cluster is FLUSHED before every row)"
)

ROWS = [
    hurtle_row(
        "hurtle-cluster-solo",
        "Redis Cluster, solo pool, concurrency 1",
        "--pool",
        "solo",
        store="cluster",
        install=CLUSTER,
    ),
    hurtle_row(
        "hurtle-cluster-wait",
        "Redis Cluster, ?wait_replicas=1, solo pool, concurrency 1",
        "--pool",
        "solo",
        store="cluster",
        url_query="?wait_replicas=1",
        install=CLUSTER,
    ),
    hurtle_row(
        "hurtle-cluster-3q",
        "Redis Cluster, 3 queues on 3 masters, 3 solo worker processes (one per queue)",
        publish="publish_spread",
        worker=THREE_WORKERS,
        store="cluster",
        install=CLUSTER,
    ),
]
