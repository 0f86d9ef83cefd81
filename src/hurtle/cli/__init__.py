"""The ``hurtle`` command: one module per subcommand, one parser built here.

Errors a user can fix (a wrong app path, a bad broker URL or setting, an unreachable broker, a
missing optional package) print one line and exit with status 2, without a traceback.
The logging options (``--log-level``, ``--log-format``, ``--log-config``: ``logs``) are accepted
before or after the subcommand. Building the parser imports no user code and reads no setting,
so ``hurtle --help`` works whatever the environment holds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import HurtleError
from . import control, dashboard, dead, demo, logs, schedule, status, worker

EXIT_USAGE = 2
#: Optional packages: a command that needs one that is missing says which extra installs it.
OPTIONAL = {
    "redis": "redis",
    "hiredis": "redis",
    "gevent": "gevent",
    "eventlet": "eventlet",
    "starlette": "dashboard",
    "uvicorn": "dashboard",
    "prometheus_client": "dashboard",
}


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser``, at any depth (``hurtle bench tasks`` is two deep)."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += [child, *_subparsers(child)]
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hurtle", description="hurtle: a fast distributed task queue that keeps its promises"
    )
    parser.add_argument("--version", action="version", version=f"hurtle {__version__}")
    logs.add_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (worker, status, dead, control, schedule, demo, dashboard):
        module.add_parser(sub)
    try:  # the benchmark suite is optional: it lives in hurtle.bench
        from ..bench import cli as bench_cli
    except ImportError:
        pass
    else:
        bench_cli.add_parser(sub)
    for child in _subparsers(parser):  # after the subcommand too; unset there, the top's stand
        logs.add_options(child, top=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logs.setup(args)
        return int(args.handler(args) or 0)
    except HurtleError as err:
        print(f"hurtle: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top not in OPTIONAL:
            raise
        print(
            f"hurtle: error: this needs the {top} package, which is not installed: "
            f"pip install 'hurtle[{OPTIONAL[top]}]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
