"""``hurtle bench features``: what each feature costs the consume path, on Redis.

Each row publishes N calls of ``bench.add(i, 6)`` registered with some task options, then consumes
them with one worker process (``hurtle.bench.peers.features_app``), like ``hurtle bench tasks``
does; it reports consume tasks/s and the ratio to the ``bare`` row of the same run (the ratio,
and the targets, are about consuming), and the publish rate beside it (``unique_for`` costs
there too: each send takes its lock). With ``--rounds R``
the rows run R times in turn (so that a noisy moment hits every row alike) and each row shows
its median. In each round ``bare`` runs before every other row and after the last, and a row's
ratio is to the mean of the two ``bare`` runs beside it; the table shows the median of those
ratios over the rounds, and their range. A row whose option
this hurtle does not have (registering the task raises ``TypeError``) is skipped with the note
"option not available", so rows appear by themselves once the feature exists.

The ``outbox`` row is about publishing: its calls go through the outbox (``outbox=``, in the
PostgreSQL database of ``--outbox-url``) in transactions of 1,000, relayed to Redis by a
``hurtle outbox relay`` process (``peers.outbox_app``); its notes give its publish rate over the
``bare`` row's (``send_many`` straight to Redis) and the relay's lag, commit to published.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from ...cli._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm_flush
from ..harness import options, rounds
from ..harness.scenario import Row
from .rows import BARE, OUTBOX, ROWS, Feature

#: The outbox row's database unless ``--outbox-url`` says otherwise.
OUTBOX_URL = "postgresql://postgres@127.0.0.1:5432/postgres?schema=hurtle_bench"

HELP = "consume tasks/s with each feature on, as a ratio to none (Redis)"


def describe() -> str | None:
    """What ``hurtle bench features --help`` says above its options."""
    return (
        "Publish then consume N tasks per row on Redis: "
        + ", ".join(row.name for row in ROWS)
        + ". Each row's ratio is to the bare row of the same run."
    )


def add_options(p: argparse.ArgumentParser) -> None:
    options.add_count(p, 100_000)
    options.add_redis_url(p, help="use this Redis instead of starting one; its database is FLUSHED")
    p.add_argument(
        "--only", default="", help="comma-separated rows, run in this order (bare always runs)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every row this many times, in turn; report medians (default 3)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per phase of a row")
    p.add_argument(
        "--outbox-url",
        default=os.environ.get("HURTLE_BENCH_OUTBOX_URL", OUTBOX_URL),
        help="the PostgreSQL database of the outbox row (its schema is made, its outbox table "
        f"emptied; default {OUTBOX_URL}); '' skips the row",
    )
    add_yes(p, "flush --redis-url")


def run(args: argparse.Namespace) -> int:
    from ..harness import machine, servers
    from ..harness.runner import Runner

    os.environ["HURTLE_BENCH_OUTBOX_URL"] = args.outbox_url  # the outbox row's (rows.py)
    chosen = rows_of(args.only)
    runs: list[list[Row]] = []
    if not confirm_flush([args.redis_url], yes=args.yes):
        return EXIT_NOT_CONFIRMED
    with servers.redis_url(args.redis_url) as url:
        info = machine.describe(url)
        with tempfile.TemporaryDirectory(prefix="hurtle-bench-features-") as tmp:
            runner = Runner(url, Path(tmp), timeout=args.timeout)
            for n in range(max(args.rounds, 1)):
                done: list[Row] = []
                # bare before every other row and after the last: each row is compared with
                # the bare runs right beside it
                for feature in rounds.interleave(chosen, BARE):
                    why = feature.unavailable()
                    if why is not None:
                        done.append(Row(name=feature.name, system="hurtle", skipped=why))
                        continue
                    print(f"-- {feature.name} (round {n + 1})", file=sys.stderr, flush=True)
                    done.append(runner.run(feature.scenario(), args.count))
                runs.append(done)
    print(
        f"hurtle bench features: {args.count:,} x add(i, 6) per row on Redis "
        f"{info['redis']}; {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
        f"{info['date']}; median of {len(runs)} round(s)"
    )
    print(table(runs))
    return 0 if all(r.skipped or r.consumed == r.count for rows in runs for r in rows) else 1


def rows_of(only: str) -> list[Feature]:
    """The rows ``--only`` names (comma-separated), in the order given, ``bare`` first; every
    row when it names none. The order is kept because a row's place in a round can move its
    ratio on a busy machine: swapping two rows shows how much."""
    wanted = list(dict.fromkeys(n.strip() for n in only.split(",") if n.strip()))
    if not wanted:
        return list(ROWS)
    by_name = {r.name: r for r in ROWS}
    return [BARE, *(by_name[n] for n in wanted if n in by_name and by_name[n] is not BARE)]


def table(runs: list[list[Row]]) -> str:
    """One line per row: the median consume rate over the rounds, and the median and range of
    its ratio to the ``bare`` runs right beside it (``harness.rounds``)."""
    lines = [
        f"{'row':<14} {'consume/s':>12} {'x bare':>7} {'range':>11} {'publish/s':>12}  "
        "config / note"
    ]
    shown_rows = {r.name: r for r in runs[0]}  # each name once, in its first order
    for r in shown_rows.values():
        if r.skipped:
            lines.append(
                f"{r.name:<14} {'-':>12} {'-':>7} {'':>11} {'-':>12}  skipped: {r.skipped}"
            )
            continue
        consumed = rounds.rates(runs, r.name, lambda row: row.consume_rate)
        published = rounds.rates(runs, r.name, lambda row: row.publish_rate)
        each = rounds.ratios(runs, r.name, BARE.name)
        shown = f"{statistics.median(consumed):,.0f}" if consumed else "-"
        sent = f"{statistics.median(published):,.0f}" if published else "-"
        ratio = f"{statistics.median(each):.2f}" if each else "-"
        spread = f"{min(each):.2f}-{max(each):.2f}" if len(each) > 1 else ""
        notes = [n for rows in runs for row in rows if row.name == r.name for n in row.notes]
        if r.name == OUTBOX:  # about publishing: its publish/s over bare's send_many
            sends = rounds.ratios(runs, r.name, BARE.name, lambda row: row.publish_rate)
            if sends:
                between = f" ({min(sends):.2f}-{max(sends):.2f})" if len(sends) > 1 else ""
                notes.insert(0, f"publish x bare {statistics.median(sends):.2f}{between}")
        lines.append(
            f"{r.name:<14} {shown:>12} {ratio:>7} {spread:>11} {sent:>12}  "
            + "; ".join([r.config, *notes])
        )
    return "\n".join(lines)
