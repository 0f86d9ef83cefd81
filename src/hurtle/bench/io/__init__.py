"""``hurtle bench io``: every worker pool at high concurrency on real I/O, sleeps and CPU work.

Seed 002's experiment, for workers: 500 requests in flight, each a Redis ``INCR`` and ``GET``;
there, the sync model failed requests and restarted workers while gevent and eventlet served five
times more with none failing. Here, for each variant (``io/tasks.py``) and each pool, a real
``hurtle worker --concurrency 500`` process (or ``--processes 2``) is started on the benchmark's
own Redis and waited for; then ``count`` tasks are sent in batches and the clock runs until the
last one finishes. A row reports tasks/s, failures (dead letters, and tasks that never ran) and
p50/p99 of the time from send to finish, measured in the workers.

Rows: ``io`` and ``sleep`` for every pool, then ``--processes 2`` of the best pool; ``cpu`` for
solo with one and with two processes. The solo pool runs a tenth of the tasks in the ``sleep``
variant (10 ms each, one at a time, the full count would take minutes); rates are comparable,
its latencies are not.
"""

from __future__ import annotations

import argparse
import dataclasses

from ...cli._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm_flush
from ...errors import ConfigurationError
from ...worker.executors import POOLS
from ..harness import options

HELP = "every worker pool at concurrency 500 on Redis I/O, sleeps and CPU work"


def describe() -> str | None:
    """What ``hurtle bench io --help`` says above its options."""
    return options.paragraph(__doc__, 1)


def add_options(io: argparse.ArgumentParser) -> None:
    options.add_count(io, 20_000)
    io.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=500,
        help="tasks in flight per worker process (default 500)",
    )
    options.add_redis_url(io)
    io.add_argument(
        "--variants",
        default="io,sleep,cpu",
        help="comma-separated variants (default: io,sleep,cpu)",
    )
    io.add_argument(
        "--pools",
        default=",".join(POOLS),
        help="comma-separated pools for io and sleep (default: all)",
    )
    options.add_outputs(io)
    io.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one row may take (default 600)"
    )
    add_yes(io, "flush --redis-url")


def run(args: argparse.Namespace) -> int:
    from ..harness import machine, report, servers
    from . import tasks  # makes its app on import: not when parsing
    from .driver import IoBench
    from .report import plot, ratios, table

    if args.count < 10 or args.concurrency < 1:
        raise ConfigurationError("--count must be at least 10 and --concurrency at least 1")
    variants = options.choose(args.variants, tasks.VARIANTS, "variant")
    pools = options.choose(args.pools, POOLS, "pool")
    if not confirm_flush([args.redis_url], yes=args.yes):
        return EXIT_NOT_CONFIRMED
    with servers.redis_url(args.redis_url) as url:
        info = machine.describe(url)
        bench = IoBench(url, args.concurrency, args.timeout)
        rows = bench.run_all(variants, pools, args.count)
    lines = ratios(rows)
    report.show(
        f"hurtle bench io: {args.count:,} tasks per row, concurrency {args.concurrency} per "
        f"process; {report.machine_line(info)}",
        table(rows),
        [("ratios (same run):", lines)],
        json_path=args.json,
        document=lambda: {
            "machine": info,
            "count": args.count,
            "concurrency": args.concurrency,
            "rows": [dataclasses.asdict(r) | {"rate": r.rate, "failed": r.failed} for r in rows],
            "ratios": lines,
        },
        plot_path=args.plot,
        chart=lambda path: plot(
            rows,
            path,
            f"hurtle bench io: concurrency {args.concurrency}, "
            f"{info['cores']} cores, Redis {info['redis']}",
        ),
    )
    return 0 if all(r.skipped or r.failed == 0 for r in rows) else 1
