"""``hurtle bench``: one subcommand per suite (``tasks``, ``io``, ``pubsub``, ``http``,
``features``), each added by the suite's own ``add_parser``."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

#: The suites, in the order ``hurtle bench --help`` lists them: modules under ``hurtle.bench``,
#: each with ``add_parser(subparsers)`` that sets ``handler``.
SUITES = ("tasks", "io", "pubsub", "http", "features")


def add_parser(sub: Any) -> None:
    bench: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="benchmarks: hurtle against raw Redis loops and its peers",
        description="Benchmarks. Each prints one line per scenario; none is part of the tests.",
    )
    kinds = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for suite in SUITES:
        importlib.import_module(f"{__package__}.{suite}").add_parser(kinds)
