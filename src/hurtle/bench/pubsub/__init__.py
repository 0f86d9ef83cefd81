"""``hurtle bench pubsub``: seed 003's pub/sub benchmark, hurtle's channels against raw clients.

C publisher/subscriber pairs (C in 1, 2, 4 by default), 50 channels, 20-byte payloads, a fixed
duration. Every publisher sends to channels picked at random as fast as it can; every subscriber
listens to all the channels, so each should receive everything every publisher sent. Reported
per row: the median messages/s per subscriber (over every subscriber's one-second samples of the
measured window, as seed 003 did), what publishers sent, the share that subscribers received
(``delivered``), the losses each system *reported* (only hurtle counts them; the others drop
silently) and what is left ``unaccounted`` (neither received nor reported lost:
silent loss). Publishers and subscribers are processes, not threads; the broker (redis-server,
the zmq proxy, nats-server) is one more process, all on the same cores.

Rows: ``hurtle-buffered`` (channels with their default buffer: 1,000 messages or 5 ms),
``hurtle-buffer0`` (``buffer=0``: one frame per publish), ``redis-publish`` (redis-py, one
``PUBLISH`` per message), ``redis-pipelined`` (a pipeline sent at 1,000 commands or every
200 ms), ``zmq-proxy`` (pyzmq PUSH → ``zmq.proxy`` PULL→PUB → SUB; skipped without pyzmq) and
``nats`` (core NATS via nats-py; skipped without nats-py or a ``nats-server`` on PATH). Each is
declared in ``pubsub/rows/``; ``driver`` runs them alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ...errors import ConfigurationError
from ..harness import options, registry
from .loop import Client
from .report import PubSubRow

#: Where the rows are declared, one module per system.
ROWS_PACKAGE = f"{__name__}.rows"


HELP = "channels against raw Redis pub/sub, a zmq proxy and NATS; msgs/s"


def describe() -> str | None:
    """What ``hurtle bench pubsub --help`` says above its options."""
    return options.paragraph(__doc__, 1)


def add_options(pubsub: argparse.ArgumentParser) -> None:
    pubsub.add_argument(
        "--pairs",
        default="1,2,4",
        help="comma-separated publisher/subscriber pair counts (default 1,2,4)",
    )
    pubsub.add_argument(
        "--duration", type=float, default=5.0, help="seconds each row publishes (default 5)"
    )
    pubsub.add_argument("--channels", type=int, default=50, help="channels (default 50)")
    pubsub.add_argument("--size", type=int, default=20, help="payload bytes (default 20)")
    pubsub.add_argument("--only", default="", help="comma-separated rows (default: all)")
    options.add_redis_url(pubsub, help="use this Redis instead of starting one")
    options.add_outputs(pubsub)


def run(args: argparse.Namespace) -> int:
    from ..harness import machine, report, servers
    from .driver import run_row
    from .report import plot, ratios, table

    try:
        pair_counts = [int(p) for p in args.pairs.split(",") if p.strip()]
    except ValueError as err:
        raise ConfigurationError(f"--pairs {args.pairs!r}: give numbers like 1,2,4") from err
    if not pair_counts or min(pair_counts) < 1 or args.duration < 1 or args.channels < 1:
        raise ConfigurationError("--pairs must be >= 1, --duration >= 1 s, --channels >= 1")
    by_name: dict[str, Client] = {row.name: row for row in registry.discover(ROWS_PACKAGE)}
    wanted = options.choose(args.only, list(by_name), default=list(by_name))
    results: list[PubSubRow] = []
    with servers.redis_url(args.redis_url) as url:
        info = machine.describe(url)
        for name in wanted:
            client = by_name[name]
            skip = client.missing()
            for pairs in pair_counts:
                print(f"-- {name} C={pairs}", file=sys.stderr, flush=True)
                if skip:
                    results.append(PubSubRow(name, pairs, skipped=skip))
                    continue
                results.append(run_row(client, pairs, url, args))
    lines = ratios(results)
    report.show(
        f"hurtle bench pubsub: {args.channels} channels, {args.size}-byte payloads, "
        f"{args.duration:g} s per row, C publisher + C subscriber processes; "
        f"{report.machine_line(info)}",
        table(results),
        [("ratios (same run, median msgs/s per subscriber):", lines)],
        json_path=args.json,
        document=lambda: {
            "benchmark": "hurtle bench pubsub",
            "machine": info,
            "channels": args.channels,
            "payload_bytes": args.size,
            "duration": args.duration,
            "rows": [
                dataclasses.asdict(r) | {"delivered": r.delivered, "unaccounted": r.unaccounted}
                for r in results
            ],
            "ratios": lines,
        },
        plot_path=args.plot,
        chart=lambda path: plot(
            results,
            path,
            f"hurtle bench pubsub: {args.channels} channels, {args.size} B, {info['cores']} cores",
        ),
    )
    return 0 if all(r.skipped or r.received for r in results) else 1
