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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..app import Hurtle
from .scenario import Row, Scenario

_PY = "{python}"
#: A rate that never binds at bench speed, and a uniqueness window longer than any run.
_RATE = "10000000/s"
_UNIQUE = 3600
#: (row name, task options, worker options).
ROWS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("bare", {}, ()),
    ("store_result", {"store_result": True}, ()),
    ("rate_limit", {"rate_limit": _RATE}, ()),
    ("unique_for", {"unique_for": _UNIQUE}, ()),
    ("time_limit", {"time_limit": 10}, ()),
    (
        "all",
        {"store_result": True, "rate_limit": _RATE, "unique_for": _UNIQUE, "time_limit": 10},
        (),
    ),
    ("threads-8", {}, ("--pool", "threads", "--concurrency", "8")),
    # the worker's call log at its default level (``bare`` runs at WARNING: logging off), and
    # with a line for every call
    ("log-default", {}, ("--log-level", "INFO")),
    ("log-tasks", {}, ("--log-level", "INFO", "--log-tasks")),
]


def unavailable(options: dict[str, Any]) -> str | None:
    """Why a task cannot be registered with ``options`` here, or None if it can."""
    try:
        Hurtle("memory://").task(name="probe", **options)(lambda x, y: x + y)
    except TypeError as err:
        return f"option not available ({err})"
    return None


def scenario(name: str, options: dict[str, Any], worker: tuple[str, ...]) -> Scenario:
    env = {"HURTLE_BENCH_OPTIONS": json.dumps(options)}
    if "--pool" in worker:
        env["HURTLE_BENCH_PROBE_LOCK"] = "1"  # tasks count from several threads
    return Scenario(
        name=name,
        system="hurtle",
        guarantee="acknowledged",
        config=(", ".join(f"{k}={v!r}" for k, v in options.items()) or "no option")
        + (f"; {' '.join(worker)}" if worker else "; solo"),
        publisher=(
            _PY,
            "-m",
            "hurtle.bench.publish",
            "hurtle.bench.peers.features_app:publish",
            "{count}",
        ),
        worker=(
            _PY,
            "-m",
            "hurtle",
            "--log-level",
            "WARNING",
            "worker",
            "hurtle.bench.peers.features_app:app",
            *worker,
        ),
        env=env,
        modules=("redis",),
        version_of="hurtle",
    )


def add_parser(kinds: Any) -> None:
    p: argparse.ArgumentParser = kinds.add_parser(
        "features",
        help="consume tasks/s with each feature on, as a ratio to none (Redis)",
        description="Publish then consume N tasks per row on Redis: "
        + ", ".join(name for name, _, _ in ROWS)
        + ". Each row's ratio is to the bare row of the same run.",
    )
    p.add_argument("--count", "-n", type=int, default=100_000, help="tasks per row")
    p.add_argument(
        "--redis-url",
        default=None,
        help="use this Redis instead of starting one; its database is FLUSHED",
    )
    p.add_argument("--only", default="", help="comma-separated rows (bare always runs)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every row this many times, in turn; report medians (default 3)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per phase of a row")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from . import machine
    from .redis_server import RedisServer
    from .runner import Runner

    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    chosen = [r for r in ROWS if not wanted or r[0] in wanted or r[0] == "bare"]
    server = None if args.redis_url else RedisServer()
    url = args.redis_url or (server.url if server else "")
    rounds: list[list[Row]] = []
    try:
        info = machine.describe(url)
        with tempfile.TemporaryDirectory(prefix="hurtle-bench-features-") as tmp:
            runner = Runner(url, Path(tmp), timeout=args.timeout)
            bare = ROWS[0]
            for n in range(max(args.rounds, 1)):
                rows: list[Row] = []
                # bare before every other row and after the last: each row is compared with
                # the bare runs right beside it
                order = [bare]
                for row in chosen:
                    if row[0] != "bare":
                        order += [row, bare]
                for name, options, worker in order:
                    why = unavailable(options)
                    if why is not None:
                        rows.append(Row(name=name, system="hurtle", skipped=why))
                        continue
                    print(f"-- {name} (round {n + 1})", file=sys.stderr, flush=True)
                    rows.append(runner.run(scenario(name, options, worker), args.count))
                rounds.append(rows)
    finally:
        if server is not None:
            server.stop()
    print(
        f"hurtle bench features: {args.count:,} x add(i, 6) per row on Redis "
        f"{info['redis']}; {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
        f"{info['date']}; median of {len(rounds)} round(s)"
    )
    print(table(rounds))
    return 0 if all(r.skipped or r.consumed == r.count for rows in rounds for r in rows) else 1


def table(rounds: list[list[Row]]) -> str:
    """One line per row: the median consume rate over the rounds, and the median and range of
    its ratio to the ``bare`` runs right beside it (before and after it in its round): the
    machine's speed drifts from one second to the next, and a ratio of medians would mix
    moments."""

    def rates(name: str, publish: bool = False) -> list[float]:
        return [
            rate
            for rows in rounds
            for r in rows
            if r.name == name and (rate := r.publish_rate if publish else r.consume_rate)
        ]

    def ratios(name: str) -> list[float]:
        out = []
        for rows in rounds:
            for i, r in enumerate(rows):
                rate = r.consume_rate
                if r.name != name or not rate:
                    continue
                if name == "bare":
                    out.append(1.0)
                    continue
                # the bare runs just before and just after this one, when they ran
                beside = [
                    b
                    for j in (i - 1, i + 1)
                    if 0 <= j < len(rows) and rows[j].name == "bare" and (b := rows[j].consume_rate)
                ]
                if beside:
                    out.append(rate / statistics.fmean(beside))
        return out

    lines = [
        f"{'row':<14} {'consume/s':>12} {'x bare':>7} {'range':>11} {'publish/s':>12}  "
        "config / note"
    ]
    shown_rows = {r.name: r for r in rounds[0]}  # each name once, in its first order
    for r in shown_rows.values():
        if r.skipped:
            lines.append(
                f"{r.name:<14} {'-':>12} {'-':>7} {'':>11} {'-':>12}  skipped: {r.skipped}"
            )
            continue
        consumed, published, each = rates(r.name), rates(r.name, True), ratios(r.name)
        shown = f"{statistics.median(consumed):,.0f}" if consumed else "-"
        sent = f"{statistics.median(published):,.0f}" if published else "-"
        ratio = f"{statistics.median(each):.2f}" if each else "-"
        spread = f"{min(each):.2f}-{max(each):.2f}" if len(each) > 1 else ""
        notes = [n for rows in rounds for row in rows if row.name == r.name for n in row.notes]
        lines.append(
            f"{r.name:<14} {shown:>12} {ratio:>7} {spread:>11} {sent:>12}  "
            + "; ".join([r.config, *notes])
        )
    return "\n".join(lines)
