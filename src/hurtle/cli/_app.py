"""Finding the user's app from ``module:attribute`` on the command line, and its broker, for
the sub-commands that take APP (``app_command``).

Only ``hurtle worker`` creates a SQLite file; every other command opens an existing one only
(``open_broker``), so that one run from the wrong directory says so instead of showing the
zeros of a new empty file, and each says which file it uses (``describe``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..app import Hurtle
from ..brokers import Broker
from ..errors import ConfigurationError

#: How a sub-command's APP argument is described in its help.
APP_HELP = "the app, as module:attribute"


def app_command(
    sub: Any,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    *,
    actions: Sequence[str] = (),
    action_help: str | None = None,
    action_first: bool = False,
    app_help: str = APP_HELP,
    **about: Any,
) -> argparse.ArgumentParser:
    """The sub-command ``hurtle NAME APP`` run by ``handler``, for the caller to add its options
    to; with ``actions``, an ACTION chosen from them follows APP (precedes it with
    ``action_first``: ``hurtle db upgrade APP``). ``about`` is its help, description and epilog."""
    parser: argparse.ArgumentParser = sub.add_parser(name, **about)
    if actions and action_first:
        parser.add_argument("action", choices=actions, help=action_help)
    parser.add_argument("app", help=app_help)
    if actions and not action_first:
        parser.add_argument("action", choices=actions, help=action_help)
    parser.set_defaults(handler=handler)
    return parser


def add_seconds(parser: argparse.ArgumentParser, flag: str, default: float, help: str) -> None:
    """An option ``flag S`` of a number of seconds, ``default`` when not given."""
    parser.add_argument(flag, type=float, default=default, metavar="S", help=help)


def load_app(path: str) -> Hurtle:
    """Import ``module:attr`` (``attr`` defaults to ``app``) from the current directory."""
    module_name, _, attr = path.partition(":")
    attr = attr or "app"
    if not module_name:
        raise ConfigurationError(f"app path {path!r} names no module: use module:app")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ConfigurationError(
                f"cannot import {module_name!r} (from {path!r}): no such module in {cwd} "
                "or on PYTHONPATH"
            ) from None
        raise
    app = getattr(module, attr, None)
    if app is None:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(app, Hurtle):
        raise ConfigurationError(f"{path!r} is a {type(app).__name__}, not a hurtle.Hurtle app")
    return app


def open_broker(app: Hurtle, *, create: bool = False) -> Broker:
    """The app's broker, connected now; without ``create`` a SQLite file that does not exist is
    a ``ConfigurationError`` naming its absolute path, and no file is made."""
    return app.connect(create=create)


def file_of(broker: Broker) -> str | None:
    """The absolute path of a SQLite broker's file; None for a broker without one."""
    path = getattr(broker, "path", None)
    return None if path is None else str(Path(path).resolve())


def describe(broker: Broker) -> str:
    """The broker's URL and, for a SQLite broker, the absolute path of its file."""
    path = file_of(broker)
    return broker.url if path is None else f"{broker.url} (file {path})"


def announce(broker: Broker) -> None:
    """Say on stderr which SQLite file a command works on (stdout stays its output); a
    network broker's URL is what the user set, and an error names it anyway."""
    if file_of(broker) is not None:
        print(f"broker: {describe(broker)}", file=sys.stderr, flush=True)
