"""Row ``raw-nats``: the raw nats-py JetStream loop of ``peers.raw_nats``, on the NATS server of
``--broker-url nats://`` (skipped without one)."""

from __future__ import annotations

from ...peers import raw_nats
from ..common import NATS_INSTALL, raw_row

ROWS = [
    raw_row(
        raw_nats,
        "nats-py",
        "acknowledged",
        "JetStream work-queue stream, publish acks awaited per 1000 / pull fetch 1000, "
        "msg.ack() each",
        store="nats",
        module="nats",
        install=NATS_INSTALL,
    ),
]
