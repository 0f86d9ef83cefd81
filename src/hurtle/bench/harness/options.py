"""The command-line options the suites share (``--redis-url``, ``--only``, ``--json``,
``--plot``) and the one reading of a comma-separated choice such as ``--only a,b``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ...errors import ConfigurationError

FLUSHED = "use this Redis instead of starting one; its database is FLUSHED before every row"


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
