"""``hurtle status APP``: how many messages each queue has ready, delayed, in flight and dead,
and which queues are paused, on which broker (for SQLite, the file's absolute path: the file
must exist, ``_app.open_broker``)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..dashboard.queries import queue_counts, queue_stats
from ._app import app_command, describe, file_of, load_app, open_broker


def add_parser(sub: Any) -> None:
    p = app_command(sub, "status", run, help="queue counts")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    broker = open_broker(app)
    stats = queue_stats(broker, app.queues())
    names = list(stats)
    if args.json:
        doc = {
            "broker": broker.url,
            "file": file_of(broker),
            "time": time.time(),
            "queues": {name: queue_counts(s) for name, s in stats.items()},
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    width = max([len("queue"), *map(len, names)])
    print(f"broker: {describe(broker)}")
    print(f"{'queue':<{width}}  {'ready':>10}  {'delayed':>10}  {'in flight':>10}  {'dead':>10}")
    for name, s in stats.items():
        print(
            f"{name:<{width}}  {s.ready:>10}  {s.delayed:>10}  {s.in_flight:>10}  {s.dead:>10}"
            + ("  paused" if s.paused else "")
        )
    return 0
