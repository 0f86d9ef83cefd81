"""``hurtle worker APP``: run a worker in this process until SIGTERM/SIGINT (or drained)."""

from __future__ import annotations

import argparse
from typing import Any

from ..worker.executors import POOLS
from ._app import load_app


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "worker", help="consume tasks", description="Run a worker for APP (module:attribute)."
    )
    p.add_argument("app", help="the app, as module:attribute (e.g. tasks:app)")
    p.add_argument("--queues", "-Q", default="",
                   help="comma-separated queues (default: every queue the app's tasks name)")
    p.add_argument("--pool", "-P", default="solo", choices=POOLS, help="concurrency mode")
    p.add_argument("--concurrency", "-c", type=int, default=None,
                   help="tasks at once (default: 1 for solo, 10 for threads)")
    p.add_argument("--burst", action="store_true",
                   help="exit 0 once the queues have nothing ready, delayed or in flight")
    p.add_argument("--shutdown-timeout", type=float, default=None,
                   help="seconds running tasks get to finish on SIGTERM (default 30)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] or None
    concurrency = args.concurrency or (1 if args.pool == "solo" else 10)
    worker = app.worker(
        queues=queues, pool=args.pool, concurrency=concurrency, burst=args.burst,
        shutdown_timeout=args.shutdown_timeout,
    )
    app.broker  # noqa: B018 - connect now, so a bad URL fails before anything starts
    worker.install_signal_handlers()
    worker.run()
    return 0
