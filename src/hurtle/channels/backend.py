"""What a channel backend does (``channel.make_backend`` picks one for a broker URL).

A backend moves frames and numbers them: ``publish`` sends frames in as few round trips as the
store allows, and numbers each channel's messages as it does (the channel's count, see
``frame``: one bump per frame, in the same step that sends it, so that a channel's subscribers
receive its frames in number order). ``open_feed`` returns a ``Feed`` that yields the frames of
some channels and glob patterns (``prices.*``) as they arrive, and tells how far each channel's
count had gone when it opened, or when it may have missed frames (reconnected, read too late):
gaps and decoding live above, in ``subscription``; buffering lives in ``channel``.

Channels use the broker's URL but their own connections: they never touch a queue.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

__all__ = ["Backend", "Feed", "OutFrame", "is_pattern", "matcher"]


class OutFrame(NamedTuple):
    """A frame on its way out, with what a backend may need to know without decoding it."""

    channel: str
    #: The frame less its count (``frame.pack``): the backend appends ``frame.count``.
    data: bytes
    #: Messages in the frame: what the channel's count goes up by.
    size: int


#: What a flush sends, in order.
Frames = Sequence[OutFrame]

_GLOB = re.compile(r"[*?\[]")


def is_pattern(name: str) -> bool:
    """Whether a subscription name is a glob pattern (``*``, ``?``, ``[...]``), as in Redis."""
    return _GLOB.search(name) is not None


def matcher(channels: Sequence[str], patterns: Sequence[str]) -> Callable[[str], bool]:
    """A predicate: is this channel one of ``channels`` or matched by one of ``patterns``?"""
    exact = frozenset(channels)
    if not patterns:
        return exact.__contains__
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return lambda name: name in exact or regex.match(name) is not None


class Feed(Protocol):
    #: Times the feed lost its connection and made a new one.
    reconnects: int
    #: Set by the subscription: the channels it has heard from. A feed that reconnects asks how
    #: far their counts went meanwhile (see ``redis``).
    known: Callable[[], list[str]]
    #: Each channel's ``(epoch, count)`` when the feed opened, for every channel it may deliver
    #: that had a count then: a channel missing from it began counting later, so all its
    #: messages count. ``None`` when the feed cannot list them (Redis: each channel's first
    #: frame or mark gives its start).
    start: dict[str, tuple[int, int]] | None

    def receive(self, timeout: float) -> list[tuple[str, bytes]]:
        """The frames that arrived, waiting up to ``timeout`` seconds for the first one."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    url: str

    def publish(self, frames: Frames) -> None:
        """Send the frames, in order, in as few round trips as possible."""
        ...

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> Feed:
        """Start receiving; frames published after this returns are delivered."""
        ...

    def close(self) -> None: ...
