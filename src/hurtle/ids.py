"""Message ids: unique across processes and hosts, cheap enough for the publish hot path.

An id is a random per-process prefix followed by a counter. The prefix is drawn again in a forked
child, so parent and child never hand out the same id.
"""

from __future__ import annotations

import itertools
import os
import secrets


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
