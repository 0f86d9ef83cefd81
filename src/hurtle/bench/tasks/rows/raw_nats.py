"""Row ``raw-nats``: the raw nats-py JetStream loop of ``peers.raw_nats``, on the NATS server of
``--broker-url nats://`` (skipped without one)."""

from __future__ import annotations

from ...harness.scenario import PY, Scenario, publisher
from ...peers import raw_nats

ROWS = [
    Scenario(
        name="raw-nats",
        system="raw nats-py",
        guarantee="acknowledged",
        config="JetStream work-queue stream, publish acks awaited per 1000 / pull fetch 1000, "
        "msg.ack() each",
        store="nats",
        publisher=publisher("hurtle.bench.peers.raw_nats:publish"),
        worker=(PY, "-m", "hurtle.bench.peers.raw_nats", "consume", "{count}"),
        modules=("nats",),
        version_of="nats-py",
        install="pip install -e '.[nats]' and --broker-url nats://host:port",
        leftover=raw_nats.leftover,
    ),
]
