"""``hurtle cancel APP ID...`` and ``hurtle queue APP pause|resume|purge QUEUE``.

``cancel`` records message ids as cancelled in the broker (``Hurtle.cancel``): a worker that
fetches one of them before it started records it as a dead letter with the reason
``cancelled`` instead of running it. Text that is no message id is an error (exit 2, nothing
cancelled); an id whose result says it is settled is reported as such, not cancelled; any other
id is cancelled, also one never sent yet (the output says so: nothing indexes waiting messages).
``queue pause`` stops every worker from fetching a queue until ``queue resume``; ``hurtle
status`` shows which queues are paused. ``queue purge`` drops the queue's waiting messages (ready
and delayed; never those workers hold, nor dead letters) after asking, unless ``--yes``
(``_confirm``: without a terminal to ask at it refuses).
``queue forget`` drops an empty queue's name from the known queues (``hurtle status``, the
dashboard), and refuses one that holds messages or is paused. Each names its broker (and SQLite
file) on stderr, and never creates a SQLite file (``_app.open_broker``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..brokers import QueueStats
from ..cancels import CANCEL_TTL
from ..dashboard.queries import stats_of
from ..ids import check_message_ids
from ..names import check_queue_name
from ._app import add_seconds, announce, app_command, load_app, open_broker
from ._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm


def add_parser(sub: Any) -> None:
    c = app_command(
        sub,
        "cancel",
        run_cancel,
        help="cancel messages: not run if not started, stopped or told if running",
        description="Cancel messages by id (what send() returned): one not started yet is "
        "never run; it becomes a dead letter with the reason 'cancelled'. A task already "
        "running learns of it within a second: stopped where its pool can (the solo pool on "
        "a process's main thread, async def tasks of the asyncio pool), told through "
        "hurtle.current().cancelled elsewhere, and recorded 'cancelled' either way.",
    )
    c.add_argument("ids", nargs="+", metavar="ID", help="message ids")
    add_seconds(
        c, "--ttl", CANCEL_TTL, f"seconds the cancellation is kept (default {CANCEL_TTL:g}, a week)"
    )

    q = app_command(
        sub,
        "queue",
        run_queue,
        actions=("pause", "resume", "purge", "forget"),
        help="pause, resume, purge or forget a queue",
        description="Pause a queue (no worker fetches from it; tasks already fetched finish), "
        "resume it, or purge it: drop its waiting messages, ready and delayed (those workers "
        "hold finish, dead letters stay). Forget an empty queue: its name leaves the known "
        "queues until a message is published to it again.",
    )
    q.add_argument("queue", help="the queue's name")
    add_yes(q, "purge")


def run_cancel(args: argparse.Namespace) -> int:
    ids = list(dict.fromkeys(args.ids))
    check_message_ids(ids)
    app = load_app(args.app)
    announce(open_broker(app))
    settled = _settled(app, ids)
    wanted = [i for i in ids if i not in settled]
    for i, state in settled.items():
        print(f"{i}: already {state}, nothing to cancel")
    if wanted:
        app.cancel(*wanted, ttl=args.ttl)
        print(
            f"cancelled {len(wanted)} message id(s) for {args.ttl:g}s: a message with one of "
            "them that has not started will not run. hurtle keeps no index of waiting "
            "messages, so it cannot tell whether one was sent: an id not sent yet stays "
            "cancelled for when it is"
        )
    return 0


def _settled(app: Any, ids: list[str]) -> dict[str, str]:
    """The final states of the ids whose results say they are settled (tasks that keep
    results): those have nothing left to cancel."""
    from ..records import FINAL, decode

    settled: dict[str, str] = {}
    for i in ids:
        payload = app.broker.get_result(i)
        if payload is not None and (state := decode(payload).state) in FINAL:
            settled[i] = state
    return settled


def run_queue(args: argparse.Namespace) -> int:
    check_queue_name(args.queue)
    app = load_app(args.app)
    announce(open_broker(app))
    if args.action == "purge":
        return _purge(app, args.queue, args.yes)
    if args.action == "forget":
        return _forget(app, args.queue)
    if args.action == "pause":
        app.pause(args.queue)
        print(f"queue {args.queue!r} paused: no worker fetches from it until it is resumed")
    else:
        app.resume(args.queue)
        print(f"queue {args.queue!r} resumed")
    return 0


def _purge(app: Any, queue: str, yes: bool) -> int:
    if not yes:
        stats = stats_of(app.broker, [queue]).get(queue, QueueStats())  # its keys' included
        details = (
            f"drop its {stats.ready} ready and {stats.delayed} delayed message(s) for good "
            f"({stats.in_flight} in flight finish, {stats.dead} dead letter(s) stay)"
        )
        if not confirm(f"purge queue {queue!r}", details, yes=False):
            return EXIT_NOT_CONFIRMED
    n = app.broker.purge(queue)
    print(f"queue {queue!r} purged: {n} waiting message(s) dropped")
    return 0


def _forget(app: Any, queue: str) -> int:
    broker = app.broker
    if queue not in broker.queues():
        print(f"queue {queue!r} is not known: nothing to forget")
        return 0
    if broker.forget(queue):
        print(f"queue {queue!r} forgotten: it is known again when a message is published to it")
        return 0
    s = broker.stats([queue])[queue]
    print(
        f"queue {queue!r} not forgotten: it holds {s.ready} ready, {s.delayed} delayed, "
        f"{s.in_flight} in flight and {s.dead} dead message(s)"
        + (" and is paused" if s.paused else "")
        + "; purge it (hurtle queue APP purge, hurtle dead APP purge) or resume it first",
        file=sys.stderr,
    )
    return 1
