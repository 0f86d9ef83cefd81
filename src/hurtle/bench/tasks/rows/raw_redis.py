"""Rows ``raw-single``, ``raw-batch``, ``raw-multi``: the raw redis-py loops of
``peers.raw_redis``, with no framework and no acknowledgement."""

from __future__ import annotations

from ...harness.scenario import PY, Scenario, publisher
from ..leftover import llen


def _raw(name: str, publish: str, consume: str, config: str) -> Scenario:
    return Scenario(
        name=name,
        system="raw redis-py",
        guarantee="not acknowledged",
        config=config,
        publisher=publisher(f"hurtle.bench.peers.raw_redis:publish_{publish}"),
        worker=(PY, "-m", "hurtle.bench.peers.raw_redis", "consume", consume, "{count}"),
        modules=("redis",),
        version_of="redis",
        leftover=llen("bench:raw"),
    )


ROWS = [
    _raw("raw-single", "single", "single", "one LPUSH per task / one BLPOP per task"),
    _raw("raw-batch", "pipelined", "batch", "pipelined LPUSH, 1000 per round trip / LPOP key 1000"),
    _raw("raw-multi", "multi", "batch", "one LPUSH of 1000 values / LPOP key 1000"),
]
