"""``hurtle bench``: the benchmark commands. ``hurtle bench tasks`` is the task-queue race; the
``bench`` parser keeps room for more (``io`` later)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..cli._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm_flush
from ..errors import ConfigurationError
from .scenario import Row


def add_parser(sub: Any) -> None:
    bench: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="benchmarks: hurtle against raw Redis loops and its peers",
        description="Benchmarks. Each prints one line per scenario; none is part of the tests.",
    )
    kinds = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    from .scenarios import SCENARIOS

    tasks = kinds.add_parser(
        "tasks",
        help="publish and consume N add(5, 6) tasks per system; report tasks/s",
        description="Publish N calls of add(5, 6), then consume them in a worker process, for "
        "hurtle, the raw redis-py loops and each installed peer. Rows: "
        + ", ".join(s.name for s in SCENARIOS),
    )
    tasks.add_argument(
        "--count", "-n", type=int, default=100_000, help="tasks per row (default 100,000)"
    )
    tasks.add_argument(
        "--redis-url",
        default=None,
        help="use this Redis instead of starting one; its database is FLUSHED before every row",
    )
    tasks.add_argument(
        "--broker-url",
        default=None,
        action="append",
        help="a broker for the rows that need one, skipped without it (may be given twice): a "
        "NATS server (nats://host:port) for raw-nats and hurtle-nats-solo, whose streams are "
        "DELETED before every NATS row; a Redis Cluster (redis+cluster://host:port, any node) "
        "for the hurtle-cluster-* rows, FLUSHED before every row",
    )
    tasks.add_argument("--only", default="", help="comma-separated rows to run (default: all)")
    tasks.add_argument("--json", type=Path, default=None, help="write rows and machine here")
    tasks.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")
    tasks.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds each of a row's publish and consume may take (default 900)",
    )
    tasks.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep each row's logs and probe files here (default: a temp dir)",
    )
    add_yes(tasks, "flush --redis-url and --broker-url")
    tasks.set_defaults(handler=run_tasks)
    from .io import add_parser as add_io_parser  # the worker runtime's own benchmark

    add_io_parser(kinds)
    from .pubsub import add_parser as add_pubsub_parser  # channels against raw pub/sub clients

    add_pubsub_parser(kinds)
    from .http import add_parser as add_http_parser  # the dashboard's enqueue endpoint

    add_http_parser(kinds)

    from .features import add_parser as add_features_parser  # what each feature costs

    add_features_parser(kinds)


def run_tasks(args: argparse.Namespace) -> int:
    import redis  # noqa: F401 - every row needs it: fail before starting anything

    from . import machine, report
    from .plot import plot
    from .redis_server import RedisServer
    from .runner import Runner
    from .scenarios import BY_NAME, SCENARIOS

    if args.count < 2:
        raise ConfigurationError(f"--count must be at least 2, got {args.count}")
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ConfigurationError(
            f"unknown row(s) {', '.join(unknown)}: choose from {', '.join(BY_NAME)}"
        )
    chosen = [BY_NAME[n] for n in wanted] if wanted else SCENARIOS
    brokers: dict[str, str] = {}
    for broker_url in args.broker_url or ():
        if broker_url.startswith("nats://"):
            brokers["nats"] = broker_url
        elif "+cluster://" in broker_url:
            brokers["cluster"] = broker_url
        else:
            raise ConfigurationError(
                f"--broker-url takes a NATS server (nats://host:port) or a Redis Cluster "
                f"(redis+cluster://host:port), got {broker_url!r}; a single Redis is --redis-url"
            )
    if not confirm_flush([args.redis_url, *(args.broker_url or ())], yes=args.yes):
        return EXIT_NOT_CONFIRMED
    server = None if args.redis_url else RedisServer()
    url = args.redis_url or (server.url if server else "")
    rows: list[Row] = []
    try:
        info = machine.describe(url)
        tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="hurtle-bench-")
        root = args.workdir or Path(tmp.name if tmp else ".")
        root.mkdir(parents=True, exist_ok=True)
        runner = Runner(
            url,
            root,
            timeout=args.timeout,
            nats_url=brokers.get("nats"),
            cluster_url=brokers.get("cluster"),
        )
        try:
            for scenario in chosen:
                print(f"-- {scenario.name}", file=sys.stderr, flush=True)
                rows.append(runner.run(scenario, args.count))
        finally:
            if tmp is not None:
                tmp.cleanup()
    finally:
        if server is not None:
            server.stop()
    found = [r for r in report.ratios(rows) if r.value is not None]
    print(
        f"hurtle bench tasks: {args.count:,} x add(5, 6) per row; {info['cpu']}, "
        f"{info['cores']} cores, {info['memory_gib']} GiB, Python {info['python']}, "
        f"Redis {info['redis']}, {info['date']}"
    )
    print(report.table(rows))
    if found:
        print("\nratios (same run):")
        for ratio in found:
            print("  " + ratio.line())
    measured = [r for r in rows if r.rss_peak_mb is not None]
    if measured:
        print("\nworker RSS (MB, whole process tree): at first task / peak / at last sample")
        for r in measured:
            print(
                f"  {r.name:<22} "
                + " ".join(
                    "       -" if mb is None else f"{mb:8.1f}"
                    for mb in (r.rss_start_mb, r.rss_peak_mb, r.rss_end_mb)
                )
            )
    if args.json:
        report.write_json(args.json, info, args.count, rows, found)
        print(f"\nwrote {args.json}")
    if args.plot:
        why = plot(
            rows,
            args.plot,
            f"hurtle bench tasks: {args.count:,} x add(5, 6), "
            f"{info['cores']} cores, Redis {info['redis']}",
        )
        print(f"plot: {why}" if why else f"wrote {args.plot}")
    complete = all(r.skipped or r.consumed == r.count for r in rows)
    return 0 if complete else 1
