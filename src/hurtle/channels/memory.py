"""``memory://`` channels: frames handed between threads of one process (one app), for tests.

The backend keeps each channel's count in a dict and numbers and hands out a flush's frames
under one lock, so that every feed receives a channel's frames in number order. A feed opened
lists the counts as they are (``start``).

Each feed holds at most ``MAX_PENDING`` frames; a frame arriving at a full feed is dropped for
that feed only, which keeps, per channel, an empty frame with the count after it (a mark) and
hands it out after what it holds: the subscriber counts the gap even if nothing more comes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from . import frame
from .backend import Frames, matcher

__all__ = ["MemoryBackend"]

#: Frames a feed keeps unread before it drops new ones.
MAX_PENDING = 100_000


class _MemoryFeed:
    def __init__(self, backend: MemoryBackend, accepts: Callable[[str], bool]) -> None:
        self.reconnects = 0
        self.known: Callable[[], list[str]] = list
        self.start: dict[str, tuple[int, int]] | None = None
        self.accepts = accepts
        self._backend = backend
        self._frames: deque[tuple[str, bytes]] = deque()
        #: channel -> a mark with its count after the last frame dropped (the feed was full).
        self._dropped: dict[str, bytes] = {}
        self._ready = threading.Condition(threading.Lock())

    def put(self, channel: str, data: bytes, epoch: int, end: int) -> None:
        with self._ready:
            if len(self._frames) >= MAX_PENDING:
                self._dropped[channel] = frame.MARK + frame.count(epoch, end)
                return
            if self._dropped:  # older than this frame: they go first
                self._frames.extend(self._dropped.items())
                self._dropped.clear()
            self._frames.append((channel, data))
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
            frames += self._dropped.items()
            self._frames.clear()
            self._dropped.clear()
            return frames

    def close(self) -> None:
        self._backend.drop(self)


class MemoryBackend:
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._feeds: list[_MemoryFeed] = []
        #: channel -> messages published to it; one epoch: a memory count is never dropped.
        self._counts: dict[str, int] = {}
        self._epoch = time.time_ns() // 1000

    def publish(self, frames: Frames) -> None:
        epoch, counts = self._epoch, self._counts
        with self._lock:
            for f in frames:
                number = counts.get(f.channel, 0)
                counts[f.channel] = end = number + f.size
                data = f.data + frame.count(epoch, number)
                for feed in self._feeds:
                    if feed.accepts(f.channel):
                        feed.put(f.channel, data, epoch, end)

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _MemoryFeed:
        feed = _MemoryFeed(self, matcher(channels, patterns))
        with self._lock:
            feed.start = {c: (self._epoch, n) for c, n in self._counts.items() if feed.accepts(c)}
            self._feeds.append(feed)
        return feed

    def drop(self, feed: _MemoryFeed) -> None:
        with self._lock:
            if feed in self._feeds:
                self._feeds.remove(feed)

    def close(self) -> None:
        with self._lock:
            self._feeds.clear()
