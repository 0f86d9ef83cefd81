"""``memory://`` channels: frames handed between threads of one process (one app), for tests.

Each feed holds at most ``MAX_PENDING`` frames; a frame arriving at a full feed is dropped for
that feed only, and its subscriber counts the gap when the publisher's next frame arrives.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from .backend import Frames, matcher

__all__ = ["MemoryBackend"]

#: Frames a feed keeps unread before it drops new ones.
MAX_PENDING = 100_000


class _MemoryFeed:
    def __init__(self, backend: MemoryBackend, accepts: Callable[[str], bool]) -> None:
        self.reconnects = 0
        self.known: Callable[[], list[tuple[str, str]]] = list
        self.accepts = accepts
        self._backend = backend
        self._frames: deque[tuple[str, bytes]] = deque()
        self._ready = threading.Condition(threading.Lock())

    def put(self, channel: str, frame: bytes) -> None:
        with self._ready:
            if len(self._frames) < MAX_PENDING:
                self._frames.append((channel, frame))
                self._ready.notify()

    def receive(self, timeout: float) -> list[tuple[str, bytes]]:
        deadline = time.monotonic() + timeout
        with self._ready:
            while not self._frames:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._ready.wait(left)
            frames = list(self._frames)
            self._frames.clear()
            return frames

    def close(self) -> None:
        self._backend.drop(self)


class MemoryBackend:
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._feeds: list[_MemoryFeed] = []

    def publish(self, frames: Frames) -> None:
        with self._lock:
            feeds = list(self._feeds)
        for f in frames:
            for feed in feeds:
                if feed.accepts(f.channel):
                    feed.put(f.channel, f.data)

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _MemoryFeed:
        feed = _MemoryFeed(self, matcher(channels, patterns))
        with self._lock:
            self._feeds.append(feed)
        return feed

    def drop(self, feed: _MemoryFeed) -> None:
        with self._lock:
            if feed in self._feeds:
                self._feeds.remove(feed)

    def close(self) -> None:
        with self._lock:
            self._feeds.clear()
