"""What a channel backend does, and the one function that picks a backend for a broker URL.

A backend moves frames, nothing more: ``publish`` sends frames (one ``(channel, frame)`` pair
each) in as few round trips as the store allows, and ``open_feed`` returns a ``Feed`` that yields
the frames of some channels and glob patterns (``prices.*``) as they arrive. Sequence numbers,
gaps and decoding live above, in ``subscription``; buffering lives in ``channel``.

Channels use the broker's URL but their own connections: they never touch a queue.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

from ..errors import ConfigurationError

__all__ = ["Backend", "Feed", "OutFrame", "is_pattern", "make_backend", "matcher"]


class OutFrame(NamedTuple):
    """A frame on its way out, with what a backend may need to know without decoding it."""

    channel: str
    data: bytes
    publisher: str
    #: The number the publisher's next message on this channel will carry.
    next_seq: int


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
    #: Set by the subscription: the (channel, publisher) pairs it has heard from. A feed that
    #: reconnects may use it to tell how far each publisher got meanwhile (see ``redis``).
    known: Callable[[], list[tuple[str, str]]]

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


def make_backend(url: str) -> Backend:
    """The channel backend for a broker URL: ``memory://``, ``sqlite:///path``, ``redis://``."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme == "memory":
        from .memory import MemoryBackend

        return MemoryBackend(url)
    if scheme == "sqlite":
        from .sqlite import SQLiteBackend

        return SQLiteBackend(url)
    if scheme in ("redis", "rediss"):
        try:
            from .redis import RedisBackend
        except ImportError as err:
            raise ConfigurationError(
                f"Redis channels need the redis package ({err}): pip install 'hurtle[redis]'"
            ) from err
        return RedisBackend(url)
    if scheme in ("redis+cluster", "rediss+cluster"):
        try:
            from .redis import RedisClusterBackend
        except ImportError as err:
            raise ConfigurationError(
                f"Redis channels need the redis package ({err}): pip install 'hurtle[redis]'"
            ) from err
        return RedisClusterBackend(url)
    raise ConfigurationError(
        f"channels are not available for the broker URL {url!r}: use memory://, "
        "sqlite:///path/to/file.db, redis://host:port/db or redis+cluster://host:port"
    )
