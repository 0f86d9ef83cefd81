"""``hurtle cancel APP ID...`` and ``hurtle queue APP pause|resume|purge QUEUE``.

``cancel`` records message ids as cancelled in the broker (``Hurtle.cancel``): a worker that
fetches one of them before it started records it as a dead letter with the reason
``cancelled`` instead of running it. ``queue pause`` stops every worker from fetching a queue
until ``queue resume``; ``hurtle status`` shows which queues are paused. ``queue purge`` drops
the queue's waiting messages (ready and delayed; never those workers hold, nor dead letters)
after asking, unless ``--yes``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..app import CANCEL_TTL
from ..names import check_queue_name
from ._app import load_app


def add_parser(sub: Any) -> None:
    c: argparse.ArgumentParser = sub.add_parser(
        "cancel",
        help="cancel messages not started yet",
        description="Cancel messages by id (what send() returned): one not started yet is "
        "never run; it becomes a dead letter with the reason 'cancelled'. A task already "
        "running is not stopped.",
    )
    c.add_argument("app", help="the app, as module:attribute")
    c.add_argument("ids", nargs="+", metavar="ID", help="message ids")
    c.add_argument(
        "--ttl",
        type=float,
        default=CANCEL_TTL,
        metavar="S",
        help=f"seconds the cancellation is kept (default {CANCEL_TTL:g}, a week)",
    )
    c.set_defaults(handler=run_cancel)

    q: argparse.ArgumentParser = sub.add_parser(
        "queue",
        help="pause, resume or purge a queue",
        description="Pause a queue (no worker fetches from it; tasks already fetched finish), "
        "resume it, or purge it: drop its waiting messages, ready and delayed (those workers "
        "hold finish, dead letters stay).",
    )
    q.add_argument("app", help="the app, as module:attribute")
    q.add_argument("action", choices=("pause", "resume", "purge"))
    q.add_argument("queue", help="the queue's name")
    q.add_argument("--yes", action="store_true", help="purge without asking for confirmation")
    q.set_defaults(handler=run_queue)


def run_cancel(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    app.cancel(*args.ids, ttl=args.ttl)
    print(f"cancelled {len(set(args.ids))} message id(s) for {args.ttl:g}s")
    return 0


def run_queue(args: argparse.Namespace) -> int:
    check_queue_name(args.queue)
    app = load_app(args.app)
    if args.action == "purge":
        return _purge(app, args.queue, args.yes)
    if args.action == "pause":
        app.pause(args.queue)
        print(f"queue {args.queue!r} paused: no worker fetches from it until it is resumed")
    else:
        app.resume(args.queue)
        print(f"queue {args.queue!r} resumed")
    return 0


def _purge(app: Any, queue: str, yes: bool) -> int:
    if not yes:
        stats = app.broker.stats([queue])[queue]
        print(
            f"purge queue {queue!r}: drop its {stats.ready} ready and {stats.delayed} delayed "
            f"message(s) for good ({stats.in_flight} in flight finish, {stats.dead} dead "
            "letter(s) stay)? [y/N] ",
            end="",
            flush=True,
        )
        try:
            answer = input()
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print(f"nothing purged (answer y, or pass --yes, to purge {queue!r})")
            return 1
    n = app.broker.purge(queue)
    print(f"queue {queue!r} purged: {n} waiting message(s) dropped")
    return 0
