"""Row ``huey``: ``RedisHuey`` (``peers.huey_app``) under ``huey_consumer`` with its defaults;
not acknowledged."""

from __future__ import annotations

from ..common import LOCK, peer_row
from ..leftover import llen

ROWS = [
    peer_row(
        "huey",
        "huey",
        "Huey",
        "not acknowledged",
        "RedisHuey, huey_consumer with 1 worker thread (default), results stored",
        worker=("huey.bin.huey_consumer", "hurtle.bench.peers.huey_app.huey"),
        env=LOCK,
        leftover=llen("huey.redis.bench"),
    ),
]
