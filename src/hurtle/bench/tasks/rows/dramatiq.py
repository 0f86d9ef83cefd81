"""Row ``dramatiq``: Dramatiq's Redis broker (``peers.dramatiq_app``) with its default processes,
threads and middleware; acknowledged."""

from __future__ import annotations

from ..common import CORES, LOCK, peer_row
from ..leftover import llen

ROWS = [
    peer_row(
        "dramatiq",
        "dramatiq",
        "Dramatiq",
        "acknowledged",
        f"Redis broker, {CORES} processes x 8 threads (defaults), default middleware",
        worker=("dramatiq", "hurtle.bench.peers.dramatiq_app"),
        env=LOCK,
        leftover=llen("dramatiq:bench"),
    ),
]
