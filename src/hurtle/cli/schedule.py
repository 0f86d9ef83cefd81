"""``hurtle schedule APP list``: each periodic task with its last run (from the broker) and next.

The last run is the last tick a scheduler claimed (and enqueued), read from the broker, so it is
the same whichever worker claimed it; the next run is computed here from the schedule.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from typing import Any

from ..dashboard.queries import schedule_rows
from ._app import app_command, describe, file_of, load_app, open_broker


def add_parser(sub: Any) -> None:
    p = app_command(
        sub,
        "schedule",
        run,
        actions=["list"],
        action_help="list: each schedule, its last and next run",
        help="periodic tasks",
        description="The periodic tasks of APP.",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    broker = open_broker(app)
    now = time.time()
    rows = [{k: v for k, v in row.items() if k != "when"} for row in schedule_rows(app, now)]
    if args.json:
        doc = {"broker": broker.url, "file": file_of(broker), "time": now, "schedules": rows}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"broker: {describe(broker)}")
    if not rows:
        print(f"{args.app} has no periodic tasks (app.periodic)")
        return 0
    table = [("schedule", "task", "when", "last run", "next run")]
    for r in rows:
        s = app.schedules[r["name"]]
        table.append(
            (
                r["name"],
                r["task"],
                s.describe(),
                _local(r["last_run"], s.tz),
                _local(r["next_run"], s.tz),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _local(t: float | None, tz: Any) -> str:
    """A time in the schedule's zone, to the second (a fraction only when it has one)."""
    if t is None:
        return "never"
    dt = datetime.fromtimestamp(t, tz)
    text = dt.strftime("%Y-%m-%d %H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return f"{text} {dt.strftime('%Z')}"
