"""The ``hurtle`` command: one module per subcommand, one parser built here.

Errors a user can fix (a wrong app path, a bad broker URL or setting, an unreachable broker, a
missing optional package) print one line and exit with status 2, without a traceback.
The logging options (``--log-level``, ``--log-format``, ``--log-config``: ``logs``) are accepted
before or after the subcommand. Building the parser imports no user code and reads no setting,
so ``hurtle --help`` works whatever the environment holds. A mistyped subcommand or choice, at
any depth, gets "did you mean"; an unknown option is reported by the subcommand it was given to,
with that subcommand's usage and the closest option it has.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..errors import HurtleError
from . import control, dashboard, db, dead, demo, logs, outbox, schedule, status, worker

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
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with "did you mean" for a value that is not one of the choices (a
    subcommand, an action); subparsers are made of this class too."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            names = [str(c) for c in choices]
            close = difflib.get_close_matches(str(value), names, n=1)
            if close:
                raise argparse.ArgumentError(
                    action,
                    f"invalid choice: {value!r}: did you mean {close[0]!r}? "
                    f"(choose from {', '.join(map(repr, names))})",
                )
        super()._check_value(action, value)


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest subcommand ``args`` chose (``hurtle bench tasks`` is two deep)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            child = action.choices.get(name) if isinstance(name, str) else None
            if child is not None:
                return _chosen(child, args)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's complaint about ``extras``, and the closest option ``parser`` has to each
    unknown one."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for extra in extras:
        if extra.startswith("-"):
            hints += difflib.get_close_matches(extra.partition("=")[0], options, n=1)
    text = f"unrecognized arguments: {' '.join(extras)}"
    return text + (f"; did you mean {' or '.join(hints)}?" if hints else "")


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser``, at any depth (``hurtle bench tasks`` is two deep)."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += [child, *_subparsers(child)]
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hurtle", description="hurtle: a fast distributed task queue that keeps its promises"
    )
    parser.add_argument("--version", action="version", version=f"hurtle {__version__}")
    logs.add_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (worker, status, dead, control, schedule, db, outbox, demo, dashboard):
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
    args, extras = parser.parse_known_args(argv)
    if extras:  # said by the subcommand they were given to, with its usage
        _chosen(parser, args).error(_unrecognized(_chosen(parser, args), extras))
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
