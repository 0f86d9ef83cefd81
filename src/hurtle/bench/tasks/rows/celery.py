"""Rows ``celery-*``: Celery 5 on Redis (``peers.celery_app``) with its prefork default, its
threads pool and its gevent pool; acknowledged on receipt."""

from __future__ import annotations

from ...harness.scenario import Scenario
from ..common import CORES, LOCK, peer_row
from ..leftover import celery


def _celery(
    name: str, config: str, *options: str, modules: tuple[str, ...] = (), locked: bool = False
) -> Scenario:
    return peer_row(
        "celery",
        name,
        "Celery",
        "ack on receipt",
        f"{config}, prefetch multiplier 4",
        worker=(
            "celery",
            "-A",
            "hurtle.bench.peers.celery_app",
            "worker",
            "--loglevel",
            "WARNING",
            *options,
        ),
        modules=modules,
        env=LOCK if locked else {},
        leftover=celery,
    )


ROWS = [
    _celery("celery-prefork", f"prefork pool, concurrency {CORES} (default: cores)"),
    _celery(
        "celery-threads",
        f"threads pool, concurrency {CORES} (default: cores)",
        "--pool",
        "threads",
        locked=True,
    ),
    _celery(
        "celery-gevent",
        "gevent pool, concurrency 100",
        "--pool",
        "gevent",
        "--concurrency",
        "100",
        modules=("gevent",),
        locked=True,
    ),
]
