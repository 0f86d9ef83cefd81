"""``hurtle dead APP list|retry|purge``: look at, re-run or drop dead letters."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from ._app import load_app


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("dead", help="dead letters")
    p.add_argument("app", help="the app, as module:attribute")
    p.add_argument("action", choices=("list", "retry", "purge"))
    p.add_argument("--queue", "-q", default=None, help="one queue (default: every queue)")
    p.add_argument("--limit", type=int, default=50, help="how many to list per queue")
    p.add_argument("--json", action="store_true", help="list as JSON")
    p.set_defaults(handler=run)


def _reason_line(reason: str) -> str:
    lines = [line for line in reason.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return reason.strip()
    return f"{lines[0]} ... {lines[-1].strip()}"


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    broker = app.broker
    queues = [args.queue] if args.queue else sorted(set(app.queues()) | set(broker.queues()))
    if args.action == "list":
        out: list[dict[str, object]] = []
        for queue in queues:
            for d in broker.dead_letters(queue, limit=args.limit):
                m = d.message()
                out.append({
                    "id": d.id, "queue": d.queue, "reason": d.reason, "failed_at": d.failed_at,
                    "task": m.task if m else None, "message_id": m.id if m else None,
                    "args": list(m.args) if m else None, "raw": None if m else d.raw.hex(),
                })
        if args.json:
            print(json.dumps(out, indent=2, default=repr))
            return 0
        if not out:
            print("no dead letters")
        for row in out:
            when = datetime.datetime.fromtimestamp(float(row["failed_at"]))  # type: ignore[arg-type]
            what = (f"{row['task']}{tuple(row['args'])}"  # type: ignore[arg-type]
                    if row["task"] else f"raw {str(row['raw'])[:60]}")
            print(f"{row['id']}  {row['queue']}  {when.isoformat(timespec='seconds')}  {what}\n"
                  f"    {_reason_line(str(row['reason']))}")
        return 0
    total = 0
    for queue in queues:
        total += broker.retry_dead(queue) if args.action == "retry" else broker.purge_dead(queue)
    verb = "put back" if args.action == "retry" else "purged"
    print(f"{verb} {total} dead letters")
    return 0
