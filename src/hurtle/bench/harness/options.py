"""The command line of the suites: the parser of one suite (``add_suite``), the options they share
(``--count``, ``--redis-url``, ``--json``, ``--plot``) and the one reading of a comma-separated
choice such as ``--only a,b``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigurationError

FLUSHED = "use this Redis instead of starting one; its database is FLUSHED before every row"


def add_suite(kinds: Any, name: str, suite: Any) -> None:
    """Add ``hurtle bench NAME`` to ``kinds`` (the subparsers of ``hurtle bench``) from its
    module ``suite``: ``HELP``, ``describe()``, ``add_options(parser)`` and ``run(args)``, the
    handler."""
    parser: argparse.ArgumentParser = kinds.add_parser(
        name, help=suite.HELP, description=suite.describe()
    )
    suite.add_options(parser)
    parser.set_defaults(handler=suite.run)


def paragraph(doc: str | None, index: int) -> str | None:
    """Paragraph ``index`` of a docstring, to describe a suite with (``None`` without one)."""
    return doc.split("\n\n")[index] if doc else None


def add_count(parser: argparse.ArgumentParser, default: int) -> None:
    """``--count``/``-n``: the tasks each row runs."""
    parser.add_argument(
        "--count", "-n", type=int, default=default, help=f"tasks per row (default {default:,})"
    )


def add_redis_url(parser: argparse.ArgumentParser, help: str = FLUSHED) -> None:
    parser.add_argument("--redis-url", default=None, help=help)


def add_outputs(parser: argparse.ArgumentParser) -> None:
    """``--json FILE`` and ``--plot FILE.png``."""
    parser.add_argument("--json", type=Path, default=None, help="write rows and machine here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")


def choose(
    text: str, known: Sequence[str], what: str = "row", *, default: Sequence[str] | None = None
) -> list[str]:
    """The names of a comma-separated option, in its order, each one of ``known``; an empty
    option is ``default``, or an error when there is none."""
    chosen = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown or (not chosen and default is None):
        raise ConfigurationError(
            f"unknown {what}(s) {', '.join(unknown) or repr(text)}: choose from {', '.join(known)}"
        )
    return chosen or list(default or ())
