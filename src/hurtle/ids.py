"""Message ids: unique across processes and hosts, cheap enough for the publish hot path.

An id is a random per-process prefix followed by a counter. The prefix is drawn again in a forked
child, so parent and child never hand out the same id. Written out, an id is 24 lowercase hex
digits (up to 32 once a process has made more than 2**32): ``is_message_id`` tells text that can
be one from text that cannot (a typo, a dead letter's id, a task name).
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
from collections.abc import Iterable

from .errors import ConfigurationError


class _IdSource:
    __slots__ = ("counter", "prefix")

    def __init__(self) -> None:
        self.prefix = secrets.token_hex(8)
        self.counter = itertools.count()


_source = _IdSource()


def _reset_after_fork() -> None:
    global _source
    _source = _IdSource()


os.register_at_fork(after_in_child=_reset_after_fork)


def new_id() -> str:
    """A new 24-hex-digit message id."""
    source = _source
    return f"{source.prefix}{next(source.counter):08x}"


_ID = re.compile(r"[0-9a-f]{24,32}")


def is_message_id(text: object) -> bool:
    """Whether ``text`` has the form of a message id (24 to 32 lowercase hex digits)."""
    return isinstance(text, str) and _ID.fullmatch(text) is not None


def check_message_ids(ids: Iterable[object]) -> None:
    """Refuse (``ConfigurationError``) the first of ``ids`` that is no message id."""
    for i in ids:
        if not is_message_id(i):
            raise ConfigurationError(
                f"{i!r:.60} is not a message id: give the ids send() returns (Handle.id, "
                "24 hex digits); nothing was cancelled"
            )
