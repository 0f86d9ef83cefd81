"""Receiving: ``Subscription`` yields messages and counts every one that never arrived.

What is counted. Every message published to a channel while a subscription follows it, by any
publisher, is either received (``received``) or counted in ``lost``; each loss is also logged as
a WARNING and passed to ``on_loss(channel, count)`` if given. Two numbers show a loss (``frame``):

* the channel's count, kept by the backend: a frame whose first number is past the one expected
  next means that the messages in between reached the broker but not this subscriber (Redis
  cut it off for reading too slowly, a reconnection, frames pruned before a slow SQLite
  subscriber read them), whoever published them, including publishers it never heard from;
* a publisher's ``unsent`` total: messages it took for a flush that failed (the broker was down)
  never got a number; its next frame (or its empty tail frame, a second after its last one)
  says how many more failed, and they count as lost too.

When a loss shows: at the channel's next frame; and, when nothing more is published, at once for
a reconnection (a Redis feed that subscribes again publishes a mark on each channel it follows:
an empty frame carrying the count as it is then) or for frames pruned unread (a SQLite feed
reads the counts of the channels whose last frames it missed). A subscription's start is the
count when it opened (a feed lists the counts, or a Redis feed waits for its own marks), so what
was published before it is not counted, and a channel whose count began later (a pattern's new
channel) is counted from its first message. A frame whose publisher number is below the one
expected repeats messages already delivered; they are skipped. A publisher not heard from for an
hour (``FORGET_AFTER``) is forgotten, so that what a subscription keeps does not grow with every
publisher that ever came and went; it keeps one count per channel it heard from.

Iterating blocks until a message arrives and ends once the subscription is closed (``with`` does
that). ``get(timeout)`` returns ``None`` when nothing came in time. A subscription belongs to one
thread; ``close()`` may be called from another, and the iteration ends within a quarter second.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import msgspec

from ..errors import ConfigurationError, DecodeError
from . import frame
from .backend import Backend, Feed, is_pattern

__all__ = ["AsyncSubscription", "ChannelMessage", "LossCallback", "Subscription"]

log = logging.getLogger(__name__)

#: ``on_loss(channel, count)``: called after ``count`` messages of ``channel`` were found lost.
LossCallback = Callable[[str, int], None]

#: Longest single wait on the backend, so that ``close()`` from another thread is seen soon.
_SLICE = 0.25
#: Seconds after which a publisher not heard from is forgotten (its next frame starts afresh):
#: the number kept per (channel, publisher) would otherwise grow with every publisher that ever
#: came and went. The brokers keep a publisher's last number for as long (one hour).
FORGET_AFTER = 3600.0
#: Seconds between two looks for publishers to forget.
SWEEP_EVERY = 60.0


class ChannelMessage(msgspec.Struct, frozen=True, gc=False):
    """One message: the channel it was published to and the decoded value."""

    channel: str
    data: Any


class Subscription:
    """Messages of some channels and patterns; see the module docstring."""

    def __init__(
        self, backend: Backend, names: Sequence[str], *, on_loss: LossCallback | None = None
    ) -> None:
        if isinstance(names, str) or not names:
            raise ConfigurationError(
                f"subscribe to one or more channel names or patterns, got {names!r}"
            )
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigurationError(
                    f"a channel name or pattern must be a non-empty string, got {name!r}"
                )
        self.channels = tuple(n for n in names if not is_pattern(n))
        self.patterns = tuple(n for n in names if is_pattern(n))
        self.on_loss = on_loss
        #: Messages found missing, by sequence number, since the subscription started.
        self.lost = 0
        #: Messages delivered to this subscription so far (handed out or waiting in it).
        self.received = 0
        #: (channel, publisher) -> (its number expected next, its unsent total then).
        self._expected: dict[tuple[str, str], tuple[int, int]] = {}
        self._heard: dict[tuple[str, str], float] = {}
        #: channel -> (epoch, number expected next) of its count.
        self._counts: dict[str, tuple[int, int]] = {}
        self._swept = time.monotonic()
        self._ready: list[ChannelMessage] = []
        self._pos = 0
        self._closed = False
        self._io = threading.Lock()
        self._feed: Feed | None = backend.open_feed(self.channels, self.patterns)
        self._feed.known = self._known
        start = self._feed.start
        #: Whether a channel first heard of began its count after the subscription started.
        self._listed = start is not None
        if start is not None:
            self._counts.update(start)
        self._reconnects = 0

    def __repr__(self) -> str:
        names = ", ".join(self.channels + self.patterns)
        return f"<Subscription {names} received={self.received} lost={self.lost}>"

    @property
    def reconnects(self) -> int:
        """Times the connection to the broker was lost and made again."""
        return self._feed.reconnects if self._feed is not None else self._reconnects

    @property
    def publishers(self) -> int:
        """(channel, publisher) pairs whose numbers this subscription follows."""
        return len(self._expected)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> ChannelMessage:
        msg = self.get(None)
        if msg is None:
            raise StopIteration
        return msg

    def next_ready(self) -> ChannelMessage | None:
        """A message already received, without waiting; ``None`` if there is none."""
        pos = self._pos
        if pos < len(self._ready):
            self._pos = pos + 1
            return self._ready[pos]
        return None

    def get(self, timeout: float | None = None) -> ChannelMessage | None:
        """The next message, waiting up to ``timeout`` seconds (``None``: until closed)."""
        pos = self._pos
        if pos < len(self._ready):
            self._pos = pos + 1
            return self._ready[pos]
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                return None
            wait = _SLICE if until is None else min(_SLICE, max(until - time.monotonic(), 0.0))
            self.fill(wait)
            msg = self.next_ready()
            if msg is not None or (until is not None and time.monotonic() >= until):
                return msg

    def fill(self, timeout: float) -> None:
        """Wait up to ``timeout`` for frames and queue their messages."""
        with self._io:
            feed = self._feed
            if feed is None:
                return
            if self._closed:
                self._close_feed()
                return
            frames = feed.receive(timeout)
            if self._closed:
                self._close_feed()
        if frames:
            self._accept(frames)

    def _accept(self, frames: list[tuple[str, bytes]]) -> None:
        if self._pos >= len(self._ready):
            self._ready, self._pos = [], 0
        ready = self._ready
        counts, expected, heard = self._counts, self._expected, self._heard
        now = time.monotonic()
        losses: list[tuple[str, int]] = []
        for channel, raw in frames:
            try:
                publisher, seq, unsent, values, epoch, number = frame.decode(raw)
            except DecodeError as err:
                log.warning(
                    "channel %r: skipped a message that is not a hurtle frame: %s", channel, err
                )
                continue
            # the channel's count: every message published to it, whoever published it
            was = counts.get(channel)
            if was is None:  # its count began after the subscription, or it starts here
                missed = number if self._listed else 0
            elif was[0] != epoch:  # a new count: the last was dropped after an hour unused
                missed = number
            elif number >= was[1]:
                missed = number - was[1]
            else:
                missed = 0
                log.warning(
                    "channel %r: its count went back from %d to %d (the broker restarted or "
                    "failed over and lost some of its writes); counting on from there",
                    channel,
                    was[1],
                    number,
                )
            counts[channel] = (epoch, number + len(values))
            if missed:
                losses.append((channel, missed))
                log.warning(
                    "channel %r: %d message(s) never arrived (numbers %d to %d of its count)",
                    channel,
                    missed,
                    number - missed,
                    number - 1,
                )
            if publisher:  # not a mark
                key = (channel, publisher)
                known = expected.get(key)
                if known is not None:
                    want, before = known
                    if seq < want:  # sent twice: what was delivered already is skipped
                        values = values[want - seq :]
                        seq = want
                    elif unsent > before and seq > want:
                        failed = min(unsent - before, seq - want)
                        losses.append((channel, failed))
                        log.warning(
                            "channel %r: %d message(s) from publisher %s were never sent (a "
                            "flush of theirs failed)",
                            channel,
                            failed,
                            publisher,
                        )
                expected[key] = (seq + len(values), unsent)
                heard[key] = now
            self.received += len(values)
            ready.extend(map(partial(ChannelMessage, channel), values))
        if now - self._swept >= SWEEP_EVERY:
            self._swept = now
            for key in [k for k, at in heard.items() if at < now - FORGET_AFTER]:
                del heard[key], expected[key]
        self.lost += sum(count for _, count in losses)
        if self.on_loss is not None:
            for channel, count in losses:
                self.on_loss(channel, count)

    def _known(self) -> list[str]:
        return list(self._counts)

    def _close_feed(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            self._reconnects = feed.reconnects
            feed.close()

    def close(self) -> None:
        """Stop receiving; an iteration in progress ends. Messages not yet read are dropped."""
        self._closed = True
        if self._io.acquire(blocking=False):
            try:
                self._close_feed()
            finally:
                self._io.release()


class AsyncSubscription:
    """``Subscription`` for asyncio: ``async for``/``async with``; waits run in a thread."""

    def __init__(self, sub: Subscription) -> None:
        self.sync = sub

    @property
    def lost(self) -> int:
        return self.sync.lost

    @property
    def received(self) -> int:
        return self.sync.received

    @property
    def reconnects(self) -> int:
        return self.sync.reconnects

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> ChannelMessage:
        msg = await self.get(None)
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def get(self, timeout: float | None = None) -> ChannelMessage | None:
        """The next message, waiting up to ``timeout`` seconds (``None``: until closed)."""
        sub = self.sync
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            msg = sub.next_ready()
            if msg is not None or sub.closed:
                return msg
            wait = _SLICE if until is None else min(_SLICE, until - time.monotonic())
            if wait <= 0:
                return None
            await asyncio.to_thread(sub.fill, wait)

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self.sync.close()
