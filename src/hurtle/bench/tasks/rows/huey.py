"""Row ``huey``: ``RedisHuey`` (``peers.huey_app``) under ``huey_consumer`` with its defaults;
not acknowledged."""

from __future__ import annotations

from ...harness.scenario import PY, Scenario, publisher
from ..common import LOCK
from ..leftover import llen

ROWS = [
    Scenario(
        name="huey",
        system="Huey",
        guarantee="not acknowledged",
        config="RedisHuey, huey_consumer with 1 worker thread (default), results stored",
        publisher=publisher("hurtle.bench.peers.huey_app:publish"),
        worker=(PY, "-m", "huey.bin.huey_consumer", "hurtle.bench.peers.huey_app.huey"),
        env=LOCK,
        modules=("huey", "redis"),
        version_of="huey",
        leftover=llen("huey.redis.bench"),
    ),
]
