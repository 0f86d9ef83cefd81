"""Row ``hurtle-nats-solo``: hurtle on NATS JetStream (``--broker-url nats://``), solo."""

from __future__ import annotations

from ..common import NATS_INSTALL, hurtle_row

ROWS = [
    hurtle_row(
        "hurtle-nats-solo",
        "NATS JetStream, solo pool, concurrency 1",
        "--pool",
        "solo",
        store="nats",
        modules=("nats", "hurtle.brokers.nats"),
        install=NATS_INSTALL,
    ),
]
