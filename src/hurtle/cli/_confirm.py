"""Asking before a command destroys something: one question, ``--yes`` to skip it, and a refusal
when nobody can answer it.

Destructive is what cannot be undone: ``hurtle dead APP purge`` (every dead letter, or those
named), ``hurtle queue APP purge`` (the waiting messages) and the ``hurtle bench`` commands given
a store of the user's (``--redis-url``, ``--broker-url``: they flush it before every row). These
ask ``[y/N]`` at a terminal; ``--yes`` skips the question; with no terminal to ask at (stdin is
not one: a script, a pipe, cron) they refuse in one line (exit 2) that says to pass ``--yes``.
Anything but ``y`` or ``yes`` is a no: nothing is done, exit 1.

Not destructive, so never asked: ``dead retry`` (the dead letters go back to their queues),
``cancel`` (a cancelled message becomes a dead letter that ``dead retry`` runs), ``queue pause``
and ``resume``, and ``queue forget`` (refused unless the queue is empty and not paused; its name
comes back with its next message).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from ..errors import ConfigurationError

#: Exit status when the question was answered no.
EXIT_NOT_CONFIRMED = 1


def add_yes(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--yes`` option of a command that asks before ``what``."""
    parser.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help=f"{what} without asking for confirmation (needed when stdin is not a terminal)",
    )


def confirm(action: str, details: str, *, yes: bool) -> bool:
    """Whether to go on with ``action`` (a verb phrase: ``"purge queue 'q'"``): True with
    ``yes``; else the question ``action: details? [y/N]`` at the terminal, True on ``y``.

    A no prints that nothing was done; with stdin not a terminal this raises a
    ``ConfigurationError`` (one line, exit 2) saying to pass ``--yes``.
    """
    if yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigurationError(
            f"refusing to {action} without a confirmation, and stdin is not a terminal to "
            f"ask at: pass --yes to {action} without asking"
        )
    print(f"{action}: {details}? [y/N] ", end="", flush=True)
    try:
        answer = input()
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print(f"nothing done (answer y, or pass --yes, to {action})")
    return False


def confirm_flush(urls: Sequence[str | None], *, yes: bool) -> bool:
    """For a benchmark given stores of the user's (``None``: one it starts itself, not asked
    about): they are flushed, every key or stream, before each row."""
    stores = [_where(u) for u in urls if u]
    if not stores:
        return True
    return confirm(
        f"flush {', '.join(stores)}",
        "the benchmark deletes every key (or stream) there before each row",
        yes=yes,
    )


def _where(url: str) -> str:
    """A store's URL without its user and password."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"
