"""Rows ``celery-*``: Celery 5 on Redis (``peers.celery_app``) with its prefork default, its
threads pool and its gevent pool; acknowledged on receipt."""

from __future__ import annotations

from ...harness.scenario import PY, Scenario, publisher
from ..common import CORES, LOCK
from ..leftover import celery


def _celery(
    name: str, config: str, *options: str, modules: tuple[str, ...] = (), locked: bool = False
) -> Scenario:
    return Scenario(
        name=name,
        system="Celery",
        guarantee="ack on receipt",
        config=f"{config}, prefetch multiplier 4",
        publisher=publisher("hurtle.bench.peers.celery_app:publish"),
        worker=(
            PY,
            "-m",
            "celery",
            "-A",
            "hurtle.bench.peers.celery_app",
            "worker",
            "--loglevel",
            "WARNING",
            *options,
        ),
        env=LOCK if locked else {},
        modules=("celery", "redis", *modules),
        version_of="celery",
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
