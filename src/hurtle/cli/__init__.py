"""The ``hurtle`` command: one module per subcommand, one parser built here.

Errors a user can fix (a wrong app path, a bad broker URL, an unreachable broker) print one line
and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..errors import HurtleError
from . import dead, demo, status, worker

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hurtle", description="hurtle: a fast distributed task queue that keeps its promises"
    )
    parser.add_argument("--log-level", default="INFO",
                        help="DEBUG, INFO, WARNING or ERROR (default: INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (worker, status, dead, demo):
        module.add_parser(sub)
    try:  # the benchmark suite is optional: it lives in hurtle.bench
        from ..bench import cli as bench_cli
    except ImportError:
        pass
    else:
        bench_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.handler(args) or 0)
    except HurtleError as err:
        print(f"hurtle: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
