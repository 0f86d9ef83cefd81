"""``hurtle bench tasks``: the task-queue race. Each row (``tasks/rows/``) publishes N calls of
``add(5, 6)``, then consumes them in a worker process, for hurtle, the raw redis-py and nats-py
loops and each installed peer; the harness's ``Runner`` runs every row alike."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ...cli._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm_flush
from ...errors import ConfigurationError
from ..harness import options, registry
from ..harness.scenario import Row

#: Where the rows are declared, one module per system.
ROWS_PACKAGE = f"{__name__}.rows"


HELP = "publish and consume N add(5, 6) tasks per system; report tasks/s"


def describe() -> str | None:
    """What ``hurtle bench tasks --help`` says above its options."""
    return (
        "Publish N calls of add(5, 6), then consume them in a worker process, for "
        "hurtle, the raw redis-py loops and each installed peer. Rows: "
        + ", ".join(s.name for s in registry.discover(ROWS_PACKAGE))
    )


def add_options(tasks: argparse.ArgumentParser) -> None:
    options.add_count(tasks, 100_000)
    options.add_redis_url(tasks)
    tasks.add_argument(
        "--broker-url",
        default=None,
        action="append",
        help="a broker for the rows that need one, skipped without it (may be given twice): a "
        "NATS server (nats://host:port) for raw-nats and hurtle-nats-solo, whose streams are "
        "DELETED before every NATS row; a Redis Cluster (redis+cluster://host:port, any node) "
        "for the hurtle-cluster-* rows, FLUSHED before every row; a PostgreSQL database "
        "(postgresql://user@host/database) for raw-postgres, hurtle-postgres-solo, pgqueuer and "
        "procrastinate, each in a schema of its own (bench_raw, bench, bench_pgqueuer, "
        "bench_procrastinate), all four DROPPED before every PostgreSQL row",
    )
    tasks.add_argument("--only", default="", help="comma-separated rows to run (default: all)")
    options.add_outputs(tasks)
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


def _brokers(urls: list[str] | None) -> dict[str, str]:
    """``--broker-url``s by kind: ``nats``, ``cluster`` and ``postgres``."""
    brokers: dict[str, str] = {}
    for broker_url in urls or ():
        if broker_url.startswith("nats://"):
            brokers["nats"] = broker_url
        elif "+cluster://" in broker_url:
            brokers["cluster"] = broker_url
        elif broker_url.startswith(("postgresql://", "postgres://")):
            brokers["postgres"] = broker_url
        else:
            raise ConfigurationError(
                f"--broker-url takes a NATS server (nats://host:port), a Redis Cluster "
                f"(redis+cluster://host:port) or a PostgreSQL database "
                f"(postgresql://user@host/database), got {broker_url!r}; a single Redis is "
                "--redis-url"
            )
    return brokers


def run(args: argparse.Namespace) -> int:
    import redis  # noqa: F401 - every row needs it: fail before starting anything

    from ..harness import machine, report, servers
    from ..harness.plot import plot
    from ..harness.runner import Runner
    from . import report as tasks_report

    if args.count < 2:
        raise ConfigurationError(f"--count must be at least 2, got {args.count}")
    by_name = {s.name: s for s in registry.discover(ROWS_PACKAGE)}
    chosen = [by_name[n] for n in options.choose(args.only, list(by_name), default=list(by_name))]
    brokers = _brokers(args.broker_url)
    results: list[Row] = []
    if not confirm_flush([args.redis_url, *(args.broker_url or ())], yes=args.yes):
        return EXIT_NOT_CONFIRMED
    with servers.redis_url(args.redis_url) as url:
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
            postgres_url=brokers.get("postgres"),
        )
        try:
            for scenario in chosen:
                print(f"-- {scenario.name}", file=sys.stderr, flush=True)
                results.append(runner.run(scenario, args.count))
        finally:
            if tmp is not None:
                tmp.cleanup()
    found = tasks_report.ratios(results)
    report.show(
        f"hurtle bench tasks: {args.count:,} x add(5, 6) per row; {report.machine_line(info)}",
        tasks_report.table(results),
        [
            ("ratios (same run):", [ratio.line() for ratio in found]),
            (
                "worker RSS (MB, whole process tree): at first task / peak / at last sample",
                tasks_report.rss_lines(results),
            ),
        ],
        json_path=args.json,
        document=lambda: tasks_report.document(info, args.count, results, found),
        plot_path=args.plot,
        chart=lambda path: plot(
            results,
            path,
            f"hurtle bench tasks: {args.count:,} x add(5, 6), "
            f"{info['cores']} cores, Redis {info['redis']}",
        ),
    )
    complete = all(r.skipped or r.consumed == r.count for r in results)
    return 0 if complete else 1
