"""``hurtle dead APP list|show|retry|purge [ID...]``: look at, re-run or drop dead letters.

Without ids, an action covers every dead letter of the queues (``--queue``, else every queue the
app or the broker knows; a queue's dead letters include its fair keys', ``brokers/fair_admin.py``).
With ids, only those: an id is a dead letter's own id (the first column of ``list``) or the id
of the message inside it (what ``send`` returned, ``message`` in ``list``).
An id that names no dead letter is reported and makes the command exit 1, after the others were
handled. ``show ID...`` prints everything a dead letter holds (its whole reason with the
traceback, the call's arguments, attempt, ids and times); a message id is found through the
broker's index (``Broker.find_dead``), a dead letter's own id by reading the queues. ``purge``
asks first (``_confirm``). The broker (and SQLite file) used is named on stderr; a SQLite file
that does not exist is an error, never created.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..brokers import Broker, DeadLetter
from ..dashboard.queries import stats_of
from ..errors import ConfigurationError, DecodeError
from ..message import Message
from ..names import fair_parent
from ..sealing import Keyring, readable_call
from ._app import announce, app_command, load_app, open_broker
from ._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm

#: Dead letters read per round trip when looking for ids.
_PAGE = 500
EXIT_NOT_FOUND = 1


def add_parser(sub: Any) -> None:
    p = app_command(
        sub,
        "dead",
        run,
        actions=("list", "show", "retry", "purge"),
        help="dead letters",
        description="List, show, retry or purge dead letters: every one of the queues, or "
        "those named by ID (show needs at least one).",
        epilog="ID is a dead letter's own id (the first column of 'list') or the id of the "
        "message it holds (what send() returned, shown as 'message' by 'list'). An ID that "
        "names no dead letter is reported and the command exits 1, after handling the others.",
    )
    p.add_argument("ids", nargs="*", metavar="ID", help="only these dead letters (see below)")
    p.add_argument("--queue", "-q", default=None, help="one queue (default: every queue)")
    p.add_argument(
        "--limit",
        type=int,
        default=50,
        help="how many to list per queue (default 50; ignored with IDs)",
    )
    p.add_argument("--json", action="store_true", help="list or show as JSON")
    add_yes(p, "purge")


def _reason_line(reason: str) -> str:
    lines = [line for line in reason.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return reason.strip()
    return f"{lines[0]} ... {lines[-1].strip()}"


def _every(broker: Broker, queue: str) -> Iterator[DeadLetter]:
    offset = 0
    while page := broker.dead_letters(queue, limit=_PAGE, offset=offset):
        yield from page
        offset += len(page)


def _named(
    broker: Broker, queues: Sequence[str], ids: Sequence[str]
) -> tuple[list[DeadLetter], list[str]]:
    """The dead letters of ``queues`` that ``ids`` name (by their id or their message's id),
    and the ids that named none."""
    wanted = set(ids)
    found: list[DeadLetter] = []
    matched: set[str] = set()
    for queue in queues:
        for d in _every(broker, queue):
            m = d.message()
            hits = {d.id, m.id} & wanted if m is not None else {d.id} & wanted
            if hits:
                found.append(d)
                matched |= hits
    return found, [i for i in dict.fromkeys(ids) if i not in matched]


def _row(d: DeadLetter, keyring: Keyring | None) -> dict[str, object]:
    """A dead letter's fields; sealed arguments opened with ``keyring`` if it can (the app's
    keys), else shown as ``sealed (key ...)``."""
    m = d.message()
    args, kwargs = readable_call(m.task, m.args, m.kwargs, keyring) if m else (None, None)
    return {
        "id": d.id,
        "queue": d.queue,
        "reason": d.reason,
        "failed_at": d.failed_at,
        "message_id": m.id if m else None,
        "task": m.task if m else None,
        "args": args,
        "kwargs": kwargs,
        "attempt": m.attempt + 1 if m else None,  # 1 is the first, as in every reason text
        "raw": None if m else d.raw.hex(),
    }


def _call(row: dict[str, Any]) -> str:
    args = [repr(a) for a in row["args"]]
    args += [f"{k}={v!r}" for k, v in row["kwargs"].items()]
    text = f"{row['task']}({', '.join(args)})"
    return text if len(text) <= 80 else text[:77] + "..."


def _print_list(rows: list[dict[str, Any]], more: dict[str, int]) -> None:
    if not rows:
        print("no dead letters")
    for row in rows:
        when = datetime.datetime.fromtimestamp(float(row["failed_at"]))
        head = f"{row['id']}  {row['queue']}  {when.isoformat(timespec='seconds')}"
        if row["task"] is not None:
            print(f"{head}  {_call(row)}  message {row['message_id']}")
        else:
            print(f"{head}  raw {str(row['raw'])[:60]}  (not a hurtle message)")
        print(f"    {_reason_line(str(row['reason']))}")
    for queue, n in more.items():
        print(f"... and {n:,} more in {queue!r} (raise --limit to see them)")


def run(args: argparse.Namespace) -> int:
    if args.action == "show" and not args.ids:
        raise ConfigurationError(
            "hurtle dead APP show needs the id of a dead letter or of its message: "
            "hurtle dead APP list shows both"
        )
    app = load_app(args.app)
    broker = open_broker(app)
    announce(broker)
    listed = broker.queues()
    queues = (
        [args.queue]
        if args.queue
        else sorted(q for q in set(app.queues()) | set(listed) if fair_parent(q) is None)
    )
    if args.action == "show":
        return _show(broker, queues, args.ids, args.json, app.keyring)
    chosen: list[DeadLetter] = []
    missing: list[str] = []
    if args.ids:
        chosen, missing = _named(broker, queues, args.ids)
        _report_missing(queues, missing)
    if args.action == "list":
        more: dict[str, int] = {}
        if not args.ids:
            for queue in queues:
                page = broker.dead_letters(queue, limit=args.limit)
                chosen += page
                total = _dead_counts(broker, [queue], listed)[queue]
                if total > len(page):
                    more[queue] = total - len(page)
        rows = [_row(d, app.keyring) for d in chosen]
        if args.json:
            print(json.dumps(rows, indent=2, default=repr))
        else:
            _print_list(rows, more)
        return EXIT_NOT_FOUND if missing else 0
    if args.action == "purge" and not _purge_confirmed(broker, queues, chosen, args, listed):
        return EXIT_NOT_CONFIRMED
    total = 0
    if args.ids:
        by_queue: dict[str, list[str]] = {}
        for d in chosen:
            by_queue.setdefault(d.queue, []).append(d.id)
        for queue, dead_ids in by_queue.items():
            if args.action == "retry":
                total += broker.retry_dead(queue, dead_ids)
            else:
                total += broker.delete_dead(queue, dead_ids)
    else:
        for queue in queues:
            if args.action == "retry":
                total += broker.retry_dead(queue)
            else:
                total += broker.purge_dead(queue)
    verb = "put back" if args.action == "retry" else "purged"
    print(f"{verb} {total} dead letters")
    return EXIT_NOT_FOUND if missing else 0


def _report_missing(queues: Sequence[str], missing: Sequence[str]) -> None:
    for i in missing:
        print(
            f"hurtle: no dead letter in {', '.join(map(repr, queues)) or 'any queue'} has "
            f"the id {i!r} (neither as its own id nor as its message's id)",
            file=sys.stderr,
        )


def _dead_counts(broker: Broker, queues: Sequence[str], listed: Sequence[str]) -> dict[str, int]:
    """How many dead letters each of ``queues`` holds, its fair keys' sub-queues' (among the
    queues ``listed``) included, as ``Broker.dead_letters`` lists them."""
    stats = stats_of(broker, queues, listed)
    return {q: stats[q].dead if q in stats else 0 for q in queues}


def _purge_confirmed(
    broker: Broker,
    queues: Sequence[str],
    chosen: list[DeadLetter],
    args: argparse.Namespace,
    listed: Sequence[str],
) -> bool:
    """Whether the purge may go on: asked unless ``--yes``; nothing to purge is not asked."""
    if args.yes:
        return True
    if args.ids:
        count = len(chosen)
        where = sorted({d.queue for d in chosen})
        action = f"purge {count} dead letter(s) named by id"
    else:
        counts = _dead_counts(broker, queues, listed)
        count = sum(counts.values())
        where = [q for q in queues if counts[q]]
        action = f"purge every dead letter of {', '.join(map(repr, queues))}"
    if count == 0:
        return True
    details = (
        f"{count} dead letter(s) of {', '.join(map(repr, where))} deleted for good "
        "('retry' puts them back in their queues instead)"
    )
    return confirm(action, details, yes=args.yes)


def _show(
    broker: Broker,
    queues: Sequence[str],
    ids: Sequence[str],
    as_json: bool,
    keyring: Keyring | None,
) -> int:
    """Everything each named dead letter holds; a message id is found through the index."""
    letters: dict[str, DeadLetter] = {}
    rest: list[str] = []
    for i in dict.fromkeys(ids):
        d = broker.find_dead(i)
        if d is not None and d.queue in queues:
            letters.setdefault(d.id, d)
        else:
            rest.append(i)  # a dead letter's own id, or no id at all: read the queues
    scanned, missing = _named(broker, queues, rest) if rest else ([], [])
    for d in scanned:
        letters.setdefault(d.id, d)
    _report_missing(queues, missing)
    details = [_detail(d, keyring) for d in letters.values()]
    if as_json:
        print(json.dumps(details, indent=2, default=repr))
    else:
        for n, row in enumerate(details):
            if n:
                print()
            _print_detail(row)
    return EXIT_NOT_FOUND if missing else 0


def _detail(d: DeadLetter, keyring: Keyring | None) -> dict[str, Any]:
    """``_row`` and the rest: the message's priority, times and headers, or why its bytes
    are no message."""
    row = _row(d, keyring)
    try:
        m = Message.decode(d.raw)
    except DecodeError as err:
        row["undecodable"] = str(err)
        return row
    row.update(
        priority=m.priority,
        sent_at=m.created or None,
        eta=m.eta or None,
        expires=m.expires or None,
        headers=dict(m.headers),
    )
    return row


def _time(t: float | None) -> str:
    if not t:
        return "-"
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


def _print_detail(row: dict[str, Any]) -> None:
    lines = [("dead letter", str(row["id"])), ("queue", str(row["queue"]))]
    if "undecodable" in row:
        lines += [
            ("message", f"none: {row['undecodable']}"),
            ("bytes", f"{str(row['raw'])[:120]}{'...' if len(str(row['raw'])) > 120 else ''}"),
        ]
    else:
        lines += [
            ("message", str(row["message_id"])),
            ("task", str(row["task"])),
            ("args", json.dumps(row["args"], default=repr)),
            ("kwargs", json.dumps(row["kwargs"], default=repr)),
            ("attempt", f"{row['attempt']} (1 is the first)"),
            ("priority", str(row["priority"])),
            ("sent at", _time(row["sent_at"])),
        ]
        if row["eta"]:
            lines.append(("due at", _time(row["eta"])))
        if row["expires"]:
            lines.append(("expires at", _time(row["expires"])))
        if row["headers"]:
            lines.append(("headers", json.dumps(row["headers"], default=repr)))
    lines.append(("failed at", _time(row["failed_at"])))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")
    print("reason:")
    for line in str(row["reason"]).rstrip().splitlines():
        print(f"    {line}")
