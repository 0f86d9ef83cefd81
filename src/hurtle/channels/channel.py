"""Publishing: ``Channel`` buffers messages and ``ChannelHub`` flushes them, one frame per burst.

``app.channel(name)`` returns the app's ``Channel`` for that name and options (the same object
each time). ``publish`` encodes the value at once (a value msgspec cannot encode fails in the
caller) and appends the bytes to the channel's buffer; the buffer goes out as one frame when it
holds ``buffer`` messages, or ``flush_interval`` seconds after its first message, whichever comes
first. ``buffer=0`` sends every ``publish`` (and every ``publish_many``) at once, in the caller's
thread. ``flush()`` sends what is buffered now; so do ``app.close()`` and the interpreter's exit
(``atexit``).

The hub owns one background thread per app, started on the first buffered message: it sleeps
until the earliest channel deadline and then sends every due channel's frame in one call to the
backend (one pipeline on Redis, one transaction on SQLite). Frames are taken and sent under one
lock, so a channel's frames leave in sequence order whichever thread sends them. The hub opens
its backend on first use: ``make_backend`` picks the one for the broker URL's scheme.

Numbers. The backend numbers every channel's messages as it sends them (``frame``: the
channel's count), and subscribers count the gaps in those numbers. A publisher adds its own:
each ``Channel`` object is a publisher with a random id, drawn again in a forked child (whose copy
of the parent's unsent buffer is dropped: the parent sends it), which numbers its messages from
0 per channel, so that a frame sent twice is delivered once. A flush that fails (the broker is
down) never reaches the count: its error is raised (``flush()``, ``buffer=0``) or logged (the
flusher), the publisher adds its messages to its ``unsent`` total, which its next frames carry,
and subscribers count them as lost. ``TAIL_DELAY`` (1 s) after a channel's last frame, the
flusher sends it an empty frame (once, not repeatedly): a subscriber that missed the last frames
of a burst, or its failed flush, finds out even if the publisher falls silent.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from . import frame
from .backend import Backend, OutFrame, is_pattern

if TYPE_CHECKING:
    from .subscription import AsyncSubscription, LossCallback, Subscription

__all__ = ["DEFAULT_BUFFER", "DEFAULT_FLUSH_INTERVAL", "Channel", "ChannelHub"]

log = logging.getLogger(__name__)

#: Messages a channel buffers before it sends them as one frame.
DEFAULT_BUFFER = 1000
#: Seconds after its first buffered message that a channel sends its buffer anyway.
DEFAULT_FLUSH_INTERVAL = 0.005
#: Most messages in one frame; a bigger ``publish_many`` goes out as several frames.
MAX_FRAME = 4096
#: Seconds after a channel's last frame that it sends an empty one carrying its next number.
TAIL_DELAY = 1.0


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a channel name must be a non-empty string, got {name!r}")
    if is_pattern(name):
        raise ConfigurationError(
            f"channel name {name!r} contains a glob character (* ? [): publish to a plain name; "
            "patterns are for app.subscribe()"
        )
    return name


def check_options(name: object, buffer: object, flush_interval: object) -> None:
    """Refuse a bad channel name, ``buffer`` or ``flush_interval`` (``ConfigurationError``)."""
    check_name(name)
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
        raise ConfigurationError(
            f"buffer={buffer!r} for channel {name!r}: give a number of messages >= 0 "
            "(0 sends each publish at once)"
        )
    if (
        isinstance(flush_interval, bool)
        or not isinstance(flush_interval, int | float)
        or not 0 < flush_interval <= sys.float_info.max  # False for NaN, inf and 10**400
    ):
        raise ConfigurationError(
            f"flush_interval={flush_interval!r} for channel {name!r}: give a finite number "
            "of seconds > 0"
        )


class Channel:
    """A named channel of one app: publish to it, or subscribe to it."""

    def __init__(
        self,
        hub: ChannelHub,
        name: str,
        *,
        buffer: int = DEFAULT_BUFFER,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        check_options(name, buffer, flush_interval)
        self.name = name
        self.buffer = buffer
        self.flush_interval = float(flush_interval)
        self._hub = hub
        self._limit = max(buffer, 1)
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._start_publisher()

    def _start_publisher(self) -> None:
        self.publisher = secrets.token_hex(8)
        self._publisher_bytes = frame.publisher_bytes(self.publisher)
        self._seq = 0
        #: Messages taken for a flush that failed: carried by every later frame.
        self._unsent = 0
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pending = []
        self._start_publisher()

    def __repr__(self) -> str:
        return f"<Channel {self.name!r} buffer={self.buffer} publisher={self.publisher}>"

    def publish(self, value: Any) -> None:
        """Send ``value`` (anything msgspec can encode) to the channel's subscribers."""
        data = frame.encode_value(value)
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            pending = self._pending
            pending.append(data)
            n = len(pending)
        if n >= self._limit:
            self._hub.flush((self,))
        elif n == 1:
            self._hub.schedule(self)

    def publish_many(self, values: Iterable[Any]) -> None:
        """Send several values; with ``buffer=0``, as one frame (up to ``MAX_FRAME``)."""
        encode = frame.encode_value
        data = [encode(v) for v in values]
        if not data:
            return
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            first = not self._pending
            self._pending.extend(data)
            n = len(self._pending)
        if n >= self._limit:
            self._hub.flush((self,))
        elif first:
            self._hub.schedule(self)

    def flush(self) -> None:
        """Send what this channel has buffered, now, in the caller's thread."""
        self._hub.flush((self,))

    def take(self) -> list[OutFrame]:
        """The buffered messages as frames, numbered; the buffer is left empty."""
        if self._pid != os.getpid():
            self._after_fork()
            return []
        with self._lock:
            pending = self._pending
            if not pending:
                return []
            self._pending = []
            seq = self._seq
            self._seq = seq + len(pending)
            unsent = self._unsent
        name, pub = self.name, self._publisher_bytes
        if len(pending) <= MAX_FRAME:
            return [OutFrame(name, frame.pack(pub, seq, unsent, pending), len(pending))]
        parts = [pending[i : i + MAX_FRAME] for i in range(0, len(pending), MAX_FRAME)]
        return [
            OutFrame(name, frame.pack(pub, seq + i * MAX_FRAME, unsent, part), len(part))
            for i, part in enumerate(parts)
        ]

    def failed(self, frames: list[OutFrame]) -> None:
        """``frames`` (taken from this channel) were not sent: their messages count as unsent."""
        with self._lock:
            self._unsent += sum(f.size for f in frames)

    def tail(self) -> list[OutFrame]:
        """An empty frame (none while messages wait: a flush is due)."""
        if self._pid != os.getpid():
            return []
        with self._lock:
            if self._pending or not self._seq:
                return []
            seq, unsent = self._seq, self._unsent
        return [OutFrame(self.name, frame.pack(self._publisher_bytes, seq, unsent, []), 0)]

    def subscribe(self, *, on_loss: LossCallback | None = None) -> Subscription:
        """A subscription to this channel: ``with ch.subscribe() as sub: for msg in sub: ...``."""
        return self._hub.subscribe((self.name,), on_loss=on_loss)

    def subscribe_async(self, *, on_loss: LossCallback | None = None) -> AsyncSubscription:
        """The same for asyncio: ``async for msg in ch.subscribe_async(): ...``."""
        return self._hub.subscribe_async((self.name,), on_loss=on_loss)


def _flush_at_exit(ref: weakref.ReferenceType[ChannelHub]) -> None:
    hub = ref()
    if hub is not None:
        hub.flush_all()


class ChannelHub:
    """An app's channels: the backend, the channel objects and the background flusher."""

    def __init__(self, url: Callable[[], str]) -> None:
        self._url = url
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, int, float], Channel] = {}
        self._reset_threads()
        atexit.register(_flush_at_exit, weakref.ref(self))

    def _reset_threads(self) -> None:
        self._pid = os.getpid()
        self._send_lock = threading.Lock()
        self._wake = threading.Condition(threading.Lock())
        self._due: dict[Channel, float] = {}
        self._tails: dict[Channel, float] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    def _after_fork(self) -> None:
        # A forked child has no flusher thread, and any lock held at the fork stays held.
        self._lock = threading.Lock()
        self._reset_threads()

    @property
    def backend(self) -> Backend:
        backend = self._backend
        if backend is None:
            with self._lock:
                if self._backend is None:
                    self._backend = make_backend(self._url())
                backend = self._backend
        return backend

    def channel(
        self,
        name: str,
        *,
        buffer: int = DEFAULT_BUFFER,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    ) -> Channel:
        check_options(name, buffer, flush_interval)  # first: a list is no key
        key = (name, buffer, flush_interval)
        with self._lock:
            found = self._channels.get(key)
            if found is None:
                found = self._channels[key] = Channel(
                    self, name, buffer=buffer, flush_interval=flush_interval
                )
            return found

    def subscribe(
        self, names: Sequence[str], *, on_loss: LossCallback | None = None
    ) -> Subscription:
        from .subscription import Subscription

        return Subscription(self.backend, names, on_loss=on_loss)

    def subscribe_async(
        self, names: Sequence[str], *, on_loss: LossCallback | None = None
    ) -> AsyncSubscription:
        from .subscription import AsyncSubscription

        return AsyncSubscription(self.subscribe(names, on_loss=on_loss))

    # -- flushing ------------------------------------------------------------------------------

    def flush(self, channels: Iterable[Channel]) -> None:
        """Send the channels' buffers now: frames in sequence order, in one backend call."""
        if self._pid != os.getpid():
            self._after_fork()
        sent: list[tuple[Channel, list[OutFrame]]] = []
        with self._send_lock:
            frames: list[OutFrame] = []
            for ch in channels:
                taken = ch.take()
                if taken:
                    frames += taken
                    sent.append((ch, taken))
            try:
                if frames:
                    self.backend.publish(frames)
            except BaseException:
                for ch, taken in sent:
                    ch.failed(taken)
                raise
            finally:
                if sent:
                    self._tail_after([ch for ch, _ in sent])

    def _tail_after(self, channels: list[Channel]) -> None:
        """Send each channel's tail frame ``TAIL_DELAY`` seconds after this flush (once)."""
        at = time.monotonic() + TAIL_DELAY
        with self._wake:
            idle = not self._tails
            for ch in channels:
                self._tails[ch] = at
            if self._thread is None:
                self._start_thread()
            elif idle:
                self._wake.notify()

    def _start_thread(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="hurtle-channel-flusher", daemon=True
        )
        self._thread.start()

    def flush_all(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
        try:
            self.flush(channels)
        except Exception:
            log.exception(
                "channels: the last flush failed; subscribers will count those messages as lost"
            )

    def schedule(self, channel: Channel) -> None:
        """Arrange for ``channel`` to be flushed ``flush_interval`` seconds from now."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._wake:
            if channel in self._due:
                return
            self._due[channel] = time.monotonic() + channel.flush_interval
            if self._thread is None:
                self._start_thread()
            else:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    if self._stopping:
                        return
                    if not self._due and not self._tails:
                        self._wake.wait()
                        continue
                    now = time.monotonic()
                    first = min(self._due.values(), default=now + TAIL_DELAY)
                    if self._tails:
                        first = min(first, min(self._tails.values()))
                    if first > now:
                        self._wake.wait(first - now)
                        continue
                    ready = [ch for ch, at in self._due.items() if at <= now]
                    for ch in ready:
                        del self._due[ch]
                    tails = [ch for ch, at in self._tails.items() if at <= now]
                    for ch in tails:
                        del self._tails[ch]
                    break
            try:
                self.flush(ready)
                if tails:
                    with self._send_lock:
                        frames = [f for ch in tails for f in ch.tail()]
                        if frames:
                            self.backend.publish(frames)
            except Exception:
                log.exception(
                    "channels: a flush failed; subscribers will count those messages as lost"
                )

    def close(self) -> None:
        """Flush every channel, stop the flusher and close the backend."""
        self.flush_all()
        with self._wake:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        with self._lock:
            backend, self._backend = self._backend, None
            self._channels.clear()
        if backend is not None:
            backend.close()
        self._reset_threads()


#: Each URL scheme's backend: its module in this package, its class, and what a failed import
#: of it lacks (what, package, extra) for the hint, or None for one that needs nothing more.
_REDIS = ("Redis", "redis", "redis")
_POSTGRES = ("PostgreSQL", "psycopg", "postgres")
_BACKENDS: dict[str, tuple[str, str, tuple[str, str, str] | None]] = {
    "memory": ("memory", "MemoryBackend", None),
    "sqlite": ("sqlite", "SQLiteBackend", None),
    "redis": ("redis", "RedisBackend", _REDIS),
    "rediss": ("redis", "RedisBackend", _REDIS),
    "redis+cluster": ("redis", "RedisClusterBackend", _REDIS),
    "rediss+cluster": ("redis", "RedisClusterBackend", _REDIS),
    "postgresql": ("postgres", "PostgresBackend", _POSTGRES),
    "postgres": ("postgres", "PostgresBackend", _POSTGRES),
}


def make_backend(url: str) -> Backend:
    """The channel backend for a broker URL: ``memory://``, ``sqlite:///path``, ``redis://``,
    ``redis+cluster://``, ``postgresql://``."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme not in _BACKENDS:
        raise ConfigurationError(
            f"channels are not available for the broker URL {url!r}: use memory://, "
            "sqlite:///path/to/file.db, redis://host:port/db, redis+cluster://host:port or "
            "postgresql://user@host/database"
        )
    module, name, needs = _BACKENDS[scheme]
    try:
        backend_class = getattr(importlib.import_module(f".{module}", __package__), name)
    except ImportError as err:
        if needs is None:
            raise
        what, package, extra = needs
        raise ConfigurationError(
            f"{what} channels need the {package} package ({err}): pip install 'hurtle[{extra}]'"
        ) from err
    backend: Backend = backend_class(url)
    return backend
