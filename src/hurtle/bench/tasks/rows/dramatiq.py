"""Row ``dramatiq``: Dramatiq's Redis broker (``peers.dramatiq_app``) with its default processes,
threads and middleware; acknowledged."""

from __future__ import annotations

from ...harness.scenario import PY, Scenario, publisher
from ..common import CORES, LOCK
from ..leftover import llen

ROWS = [
    Scenario(
        name="dramatiq",
        system="Dramatiq",
        guarantee="acknowledged",
        config=f"Redis broker, {CORES} processes x 8 threads (defaults), default middleware",
        publisher=publisher("hurtle.bench.peers.dramatiq_app:publish"),
        worker=(PY, "-m", "dramatiq", "hurtle.bench.peers.dramatiq_app"),
        env=LOCK,
        modules=("dramatiq", "redis"),
        version_of="dramatiq",
        leftover=llen("dramatiq:bench"),
    ),
]
