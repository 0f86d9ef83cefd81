"""``hurtle bench``: one subcommand per suite (``tasks``, ``io``, ``pubsub``, ``http``,
``features``), each made by ``harness.options.add_suite`` from the suite's module."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from .harness import options

#: The suites, in the order ``hurtle bench --help`` lists them: modules under ``hurtle.bench``,
#: each with ``HELP``, ``describe()``, ``add_options(parser)`` and ``run(args)``.
SUITES = ("tasks", "io", "pubsub", "http", "features")


def add_parser(sub: Any) -> None:
    bench: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="benchmarks: hurtle against raw Redis loops and its peers",
        description="Benchmarks. Each prints one line per scenario; none is part of the tests.",
    )
    kinds = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for suite in SUITES:
        options.add_suite(kinds, suite, importlib.import_module(f"{__package__}.{suite}"))
