"""``redis://`` channels: a script per frame that numbers and publishes it, ``SUBSCRIBE`` to
receive.

A flush sends all its frames in one pipeline (one round trip): for each frame,
``channel_publish.lua`` adds its messages to the channel's count and publishes it with its number
(``frame``). Redis pub/sub ignores the database number, so channel names carry it:
``hurtle:ch:<db>:<name>`` (apps on different databases of one server do not hear each other);
the count is a key of the same name, in the URL's database, kept an hour after its last frame.

Redis drops a subscriber that reads too slowly (``client-output-buffer-limit pubsub``) or whose
connection breaks; what was published until it subscribes again never reaches it. The feed does
not hide this: it reconnects (with a short backoff), counts the reconnection, logs a warning and
subscribes again, and then publishes a mark on every channel it follows (its own and those it
heard from through a pattern): an empty frame, numbered by the same script, so that it arrives
after everything published before it. The mark carries the count as it is then; the
subscription counts every message below it that it never received, whoever published it, even
if nothing is published afterwards. A feed opening publishes marks too, and waits for them (or
any frame) on its channels: its subscription starts from the count then. (Every subscriber of
the channel receives a mark; for them it is an empty frame at the count they expect.) A channel
first heard of through a pattern starts at its first frame: one that appears and loses frames
while the feed is away, before the feed heard of it, is not counted.

On a Redis Cluster (``redis+cluster://``, ``RedisClusterBackend``) a frame is one ``SPUBLISH``:
sharded pub/sub, each channel served by the master of its slot, rather than a ``PUBLISH`` that
every node of the cluster relays to every other; the count, named as the channel, lives in that
slot. A feed subscribes (``SSUBSCRIBE``) on each master that serves one of its channels and
waits on all their connections at once. Sharded pub/sub has no patterns: a cluster feed takes
channel names only, and says so.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException
from redis.retry import Retry

import redis

from ..brokers.redis.broker import _wait_option
from ..brokers.redis.scripts import _Script
from ..errors import BrokerError, ConfigurationError
from . import frame as frames_
from .backend import Frames

__all__ = ["RedisBackend", "RedisClusterBackend"]

log = logging.getLogger(__name__)

#: Frames taken from the socket per ``receive`` once the first one is there.
_MAX_BATCH = 1024
_BACKOFF_FIRST = 0.01
_BACKOFF_MAX = 1.0
#: Seconds a channel's count is kept after its last frame.
COUNT_TTL = 3600
#: Seconds a feed opening waits for its marks to come back.
_MARK_WAIT = 10.0

_publish_script: _Script | None = None


def _script() -> _Script:
    global _publish_script
    if _publish_script is None:
        _publish_script = _Script("channel_publish")
    return _publish_script


def run_frames(client: Any, frames: list[tuple[str, int, bytes]], sharded: bool) -> None:
    """Number and publish ``(channel name, size, frame less its count)`` frames, in order, in one
    pipeline; frames the server did not run for want of the script go again once it is loaded.
    Raises redis-py's errors."""
    script = _script()
    verb = "1" if sharded else "0"
    commands = [
        ("EVALSHA", script.sha, 1, name, size, data, COUNT_TTL, verb) for name, size, data in frames
    ]
    pipe = client.pipeline(transaction=False)
    for cmd in commands:
        pipe.execute_command(*cmd)
    results = pipe.execute(raise_on_error=False)
    missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:  # the server restarted or SCRIPT FLUSH: those frames were not published
        client.script_load(script.source)
        pipe = client.pipeline(transaction=False)
        for i in missing:
            pipe.execute_command(*commands[i])
        for i, r in zip(missing, pipe.execute(raise_on_error=False), strict=True):
            results[i] = r
    for r in results:
        if isinstance(r, Exception):
            raise r


def _without_broker_options(url: str, public: str) -> str:
    """``url`` less the broker's own query options (``wait_replicas``, ``wait_timeout``),
    with redis-py's (``ssl_ca_certs``, ``socket_timeout``, ...) kept."""
    return _wait_option(url, public)[0]


def _client(url: str) -> redis.Redis:
    # No silent retries inside redis-py: a broken connection must surface here, to be counted.
    try:
        return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0))
    except ValueError as err:
        raise ConfigurationError(
            f"bad Redis URL for channels {url!r}: {err}; expected redis://host:port/db"
        ) from err


class _RedisFeed:
    #: Sharded pub/sub (``SPUBLISH`` in the script): a cluster's feed.
    _sharded = False

    def __init__(
        self, backend: RedisBackend, channels: Sequence[str], patterns: Sequence[str]
    ) -> None:
        self.reconnects = 0
        self.known: Callable[[], list[str]] = list
        self.start: dict[str, tuple[int, int]] | None = None
        self._backend = backend
        self._prefix = backend.prefix
        self._names = list(channels)
        self._channels = [backend.prefix + c for c in channels]
        self._patterns = [backend.prefix + p for p in patterns]
        self._client: Any = backend._new_client()
        self._pubsub: Any = None
        self._closed = False
        #: Frames to hand out before reading the socket again (see ``_reconnect``).
        self._marks: list[tuple[str, bytes]] = []
        try:
            self._marks = self._subscribe()
            self._mark(self._names)
            self._marks += self._until_marked()
        except BaseException:
            self.close()
            raise

    def _until_marked(self) -> list[tuple[str, bytes]]:
        """The frames that come until each of the feed's channels had one (its mark, at the
        latest), so that the subscription knows where each channel's count stood."""
        waiting = set(self._names).difference(c for c, _ in self._marks)
        frames: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + _MARK_WAIT
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise redis.TimeoutError(
                    f"the marks published on {sorted(waiting)} did not come back in "
                    f"{_MARK_WAIT:g} s"
                )
            got = self._read(min(left, 0.25), [])
            frames += got
            waiting.difference_update(c for c, _ in got)
        return frames

    def _mark(self, channels: Sequence[str]) -> None:
        """Publish a mark (an empty frame with the count) on each of ``channels``."""
        if channels:
            mark = frames_.MARK
            prefix = self._prefix
            run_frames(self._client, [(prefix + c, 0, mark) for c in channels], self._sharded)

    def _subscribe(self) -> list[tuple[str, bytes]]:
        """Subscribe on a new connection; returns frames that came with the confirmations."""
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        early: list[tuple[str, bytes]] = []
        cut = len(self._prefix)
        try:
            if self._channels:
                pubsub.subscribe(*self._channels)
            if self._patterns:
                pubsub.psubscribe(*self._patterns)
            # Wait for the confirmations, so that what is published after this returns arrives;
            # frames of the channels confirmed first may arrive in between, and are kept.
            want = len(self._channels) + len(self._patterns)
            got = 0
            deadline = time.monotonic() + 10
            while got < want and time.monotonic() < deadline:
                reply = pubsub.parse_response(block=False, timeout=0.1)
                if reply is None:
                    continue
                if reply[0] in (b"subscribe", b"psubscribe"):
                    got += 1
                elif reply[0] == b"message":
                    early.append((reply[1][cut:].decode(), reply[2]))
                elif reply[0] == b"pmessage":
                    early.append((reply[2][cut:].decode(), reply[3]))
        except BaseException:
            pubsub.close()
            raise
        self._pubsub = pubsub
        return early

    def _reconnect(self, err: Exception, until: float) -> bool:
        """Subscribe again on a new connection and mark the channels followed; ``False`` if
        ``until`` passed first."""
        if self._pubsub is not None:
            self._drop_connection()
            self.reconnects += 1
            log.warning(
                "channel subscription to Redis at %s lost its connection (%s); subscribing "
                "again: messages published meanwhile are counted as lost",
                self._backend.url,
                err,
            )
        delay = _BACKOFF_FIRST
        while not self._closed:
            try:
                self._marks += self._subscribe()
                self._mark(sorted(set(self._names).union(self.known())))
                return True
            except (redis.ConnectionError, redis.TimeoutError, OSError) as again:
                self._drop_connection()
                if time.monotonic() + delay > until:
                    log.debug("Redis at %s still unreachable: %s", self._backend.url, again)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
        return False

    def _drop_connection(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self._pubsub.close()
            self._pubsub = None

    def _read(self, timeout: float, frames: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Frames read from the socket onto ``frames``, waiting up to ``timeout`` for the first
        unless ``frames`` holds some already; raises redis-py's connection errors."""
        pubsub = self._pubsub
        until = time.monotonic() + timeout
        cut = len(self._prefix)
        wait = timeout
        while len(frames) < _MAX_BATCH:
            reply = pubsub.get_message(timeout=wait)
            if reply is None:
                if frames or wait == 0:
                    break
                wait = until - time.monotonic()
                if wait <= 0:
                    break
                continue
            if reply["type"] in ("message", "pmessage"):
                frames.append((reply["channel"][cut:].decode(), reply["data"]))
                wait = 0
        return frames

    def receive(self, timeout: float) -> list[tuple[str, bytes]]:
        until = time.monotonic() + timeout
        if self._pubsub is None and not self._reconnect(ConnectionError("not connected"), until):
            return []
        frames, self._marks = self._marks, []
        try:
            self._read(timeout, frames)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
            self._reconnect(err, until)
        return frames

    def close(self) -> None:
        self._closed = True
        self._drop_connection()
        self._client.close()


class RedisBackend:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"
        db = parts.path.lstrip("/") or "0"
        if not db.isdigit():
            raise ConfigurationError(
                f"bad Redis URL {self.url!r}: the database {db!r} is not a number; expected "
                "redis://host:port/db"
            )
        self.prefix = f"hurtle:ch:{int(db)}:"
        # redis-py's options (TLS: ssl_ca_certs, ...) stay; the broker's own (wait_replicas)
        # are not redis-py's
        self.dsn = _without_broker_options(url, self.url)
        self._client = _client(self.dsn)

    def _new_client(self) -> Any:
        """A client of its own, for a feed."""
        return _client(self.dsn)

    def publish(self, frames: Frames) -> None:
        prefix = self.prefix
        try:
            run_frames(self._client, [(prefix + f.channel, f.size, f.data) for f in frames], False)
        except (redis.RedisError, OSError) as err:
            raise BrokerError(
                f"cannot publish to Redis at {self.url}: {err}; is redis-server running?"
            ) from err

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _RedisFeed:
        try:
            return _RedisFeed(self, channels, patterns)
        except (redis.RedisError, OSError) as err:
            raise BrokerError(
                f"cannot subscribe at Redis {self.url}: {err}; is redis-server running?"
            ) from err

    def close(self) -> None:
        self._client.close()


# -- Redis Cluster: sharded pub/sub -----------------------------------------------------------


class _ClusterFeed(_RedisFeed):
    """``SSUBSCRIBE`` on the masters serving the channels' slots; ``receive`` waits on all."""

    _backend: RedisClusterBackend
    _sharded = True

    def _subscribe(self) -> list[tuple[str, bytes]]:
        pubsub: Any = self._client.pubsub()
        early: list[tuple[str, bytes]] = []
        cut = len(self._prefix)
        try:
            pubsub.ssubscribe(*self._channels)
            got = 0
            deadline = time.monotonic() + 10
            while got < len(self._channels) and time.monotonic() < deadline:
                reply = pubsub.get_sharded_message(timeout=0.1)
                if reply is None:
                    continue
                if reply["type"] == "ssubscribe":
                    got += 1
                elif reply["type"] == "smessage":
                    early.append((reply["channel"][cut:].decode(), reply["data"]))
        except RedisClusterException as err:
            pubsub.close()
            raise redis.ConnectionError(f"{type(err).__name__}: {err}") from err
        except BaseException:
            pubsub.close()
            raise
        self._pubsub = pubsub
        return early

    def _mark(self, channels: Sequence[str]) -> None:
        try:
            super()._mark(channels)
        except RedisClusterException as err:
            raise redis.ConnectionError(f"{type(err).__name__}: {err}") from err

    def _reconnect(self, err: Exception, until: float) -> bool:
        client: Any = self._client
        with contextlib.suppress(Exception):  # the masters may have changed: ask the cluster
            client.nodes_manager.initialize()
        return super()._reconnect(err, until)

    def _read(self, timeout: float, frames: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        pubsub: Any = self._pubsub
        until = time.monotonic() + timeout
        cut = len(self._prefix)
        while len(frames) < _MAX_BATCH:
            # one look at every master's connection, without waiting
            reply = pubsub.get_sharded_message(timeout=0)
            if reply is not None:
                if reply["type"] == "smessage":
                    frames.append((reply["channel"][cut:].decode(), reply["data"]))
                continue
            wait = until - time.monotonic()
            if frames or wait <= 0:
                break
            with selectors.DefaultSelector() as sel:
                for node_pubsub in list(pubsub.node_pubsub_mapping.values()):
                    sock = node_pubsub.connection and node_pubsub.connection._sock
                    if sock is None:
                        raise redis.ConnectionError("a shard's connection is closed")
                    sel.register(sock, selectors.EVENT_READ)
                if not sel.select(wait):
                    break
        return frames


class RedisClusterBackend(RedisBackend):
    """Channels on a Redis Cluster: ``SPUBLISH`` and ``SSUBSCRIBE`` (Redis 7.0 or later)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}"
        self.prefix = "hurtle:ch:0:"  # a cluster has database 0 only
        self.dsn = _without_broker_options(url, self.url)
        plain = urlsplit(self.dsn)
        self._plain = plain._replace(scheme=plain.scheme.split("+")[0], path="").geturl()
        self._client: Any = self._new_client()

    def _new_client(self) -> Any:
        try:
            return RedisCluster.from_url(self._plain, retry=Retry(NoBackoff(), 0))
        except (ValueError, TypeError) as err:
            raise ConfigurationError(
                f"bad Redis Cluster URL for channels {self.url!r}: {err}; expected "
                "redis+cluster://host:port"
            ) from err
        except RedisClusterException as err:
            raise BrokerError(
                f"cannot reach the Redis Cluster at {self.url}: {err}; is it running?"
            ) from err

    def publish(self, frames: Frames) -> None:
        prefix = self.prefix
        try:
            run_frames(self._client, [(prefix + f.channel, f.size, f.data) for f in frames], True)
        except (redis.RedisError, RedisClusterException, OSError) as err:
            with contextlib.suppress(Exception):
                self._client.nodes_manager.initialize()
            raise BrokerError(
                f"cannot publish to the Redis Cluster at {self.url}: {err}; is it running?"
            ) from err

    def open_feed(self, channels: Sequence[str], patterns: Sequence[str]) -> _RedisFeed:
        if patterns:
            raise ConfigurationError(
                f"cannot subscribe to {', '.join(map(repr, patterns))} on a Redis Cluster: "
                "channels there are sharded (SSUBSCRIBE), which has no patterns; subscribe to "
                "the channels by name"
            )
        try:
            return _ClusterFeed(self, channels, patterns)
        except (redis.RedisError, RedisClusterException, OSError) as err:
            raise BrokerError(
                f"cannot subscribe at the Redis Cluster {self.url}: {err}; is it running?"
            ) from err
