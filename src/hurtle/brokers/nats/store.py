"""One NATS connection and what every part of the broker needs from it: the queues' streams
and consumers (made once per connection), KV buckets and compare-and-set loops on them.

Coroutines here run on the process's loop (``loop.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.js import api
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
)

from ...errors import BrokerError
from . import connection, names
from .options import NatsOptions, cas_unsafe, default_replicas

T = TypeVar("T")
log = logging.getLogger(__name__)

#: JetStream's error codes for a stream whose replicas it cannot place.
NO_PEERS, NOT_CLUSTERED, INSUFFICIENT_RESOURCES = 10005, 10074, 10023

#: The KV bucket of everything shared that is not a message: workers, reports, totals, ticks,
#: limits and unique locks.
STATE_BUCKET = "hurtle"
#: Workers' records (``recovery.py``) and their reports, in buckets of their own: recovery
#: lists every key of its bucket (JetStream 2.9 cannot filter a listing).
WORKERS_BUCKET = "hurtle-workers"
REPORTS_BUCKET = "hurtle-reports"
#: Result buckets by the ttl they keep records (a record goes to the first that keeps it as
#: long as its ttl, and reads check its own expiry). Longer ttls are cut to the last.
RESULT_CLASSES = (60, 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400)
#: Times a request that makes a stream, consumer or bucket is sent while none answers.
MAKE_TRIES = 4
#: Seconds a JetStream API request (a KV get or put, a stream read) waits for the server's answer.
#: nats.py's own 5 s was too short on a loaded 2-core machine: a result read timed out while
#: the server was busy, and a read that fails is a call the user sees fail.
API_TIMEOUT = 15.0
#: Seconds a new replicated stream is given to elect its leader before it is used.
LEADER_WAIT = 10.0
#: Seconds between asking the server which priority levels of a queue hold messages.
LEVELS_REFRESH = 1.0

_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.decode


def pack(value: Any) -> bytes:
    return _pack(value)


def unpack(raw: bytes) -> Any:
    return _unpack(raw)


async def make(request: Callable[[], Awaitable[T]]) -> T:
    """``request`` (a call that makes a stream or consumer: made once whatever the number of
    calls), asked again when no answer comes: a cluster (nats-server 2.9) can leave a request
    unanswered while another client makes the same stream."""
    for attempt in range(1, MAKE_TRIES + 1):
        try:
            return await request()
        except nats.errors.TimeoutError:
            if attempt == MAKE_TRIES:
                raise
    raise AssertionError("unreachable")


class Store:
    """A connection and the JetStream objects made through it."""

    def __init__(self, nc: Any, ack_wait: float, replicas: int = 1, url: str = "") -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=API_TIMEOUT)
        self.ack_wait = ack_wait
        #: Copies of each stream and KV bucket this connection makes.
        self.replicas = replicas
        self.url = url
        #: What the server said of itself when the connection was made (its INFO).
        self.server_info: dict[str, Any] = dict(getattr(nc, "_server_info", None) or {})
        self._queues: dict[str, asyncio.Future[None]] = {}
        self._kv: dict[str, Any] = {}
        # levels of each queue that may hold messages, and when the server last said so
        self._levels: dict[str, set[str]] = {}
        self._levels_at: dict[str, float] = {}
        # publish_all's acknowledgements: their subscription's subjects, and the batches
        # waiting for theirs by number
        self._acks_prefix: str | None = None
        self._acks_ready: asyncio.Future[None] | None = None
        self._batch_numbers = itertools.count()
        self._batches: dict[int, _Batch] = {}

    def note(self, queue: str, level: str) -> None:
        """A message went to ``level`` of ``queue`` from this connection."""
        self._levels.setdefault(queue, {"0"}).add(level)

    async def levels(self, queue: str) -> list[str]:
        """The levels of ``queue`` worth a pull, in the order a fetch serves them: those this
        connection published to, and those the server said held messages (asked again once
        a second, so a priority published elsewhere is served first within a second)."""
        now = time.monotonic()
        known = self._levels.setdefault(queue, {"0"})
        if now - self._levels_at.get(queue, 0.0) > LEVELS_REFRESH:
            self._levels_at[queue] = now
            try:
                info = await self.js.stream_info(
                    names.stream(queue), subjects_filter=f"hq.{names.token(queue)}.*"
                )
            except NotFoundError:
                info = None
            if info is not None:
                counts = {s.rsplit(".", 1)[1]: n for s, n in (info.state.subjects or {}).items()}
                known.intersection_update({"0", *counts})
                known.update(level for level, n in counts.items() if n)
        return [level for level in names.LEVELS if level in known]

    @classmethod
    async def connect(cls, options: NatsOptions, ack_wait: float) -> Store:
        """Connect (``connection.connect``: a ``BrokerError`` at the first failure), refuse a
        connection left in plain text when the URL asks for TLS, and settle the replicas."""
        nc = await connection.connect(
            options.servers,
            options.url,
            name="hurtle",
            max_reconnect_attempts=-1,
            **options.connect_options(),
        )
        info: dict[str, Any] = dict(getattr(nc, "_server_info", None) or {})
        if options.tls and not info.get("tls_required"):
            await nc.close()
            raise BrokerError(
                f"cannot connect to NATS at {options.url}: the server does not speak TLS; "
                "use nats:// without tls_ options, or turn TLS on in its configuration"
            )
        replicas = options.replicas or default_replicas(info, len(options.servers))
        if cas_unsafe(info, replicas):
            log.warning(
                "NATS at %s is nats-server %s in a cluster: before 2.9.21 a compare-and-set on "
                "a replicated KV bucket (replicas=%d) can let two writers win, so unique locks, "
                "rate limits, tick claims and totals may be wrong; upgrade the servers to "
                "2.9.21 or later",
                options.url,
                info.get("version"),
                replicas,
            )
        return cls(nc, ack_wait, replicas, options.url)

    # -- queues --------------------------------------------------------------------------

    async def ensure_queue(self, queue: str) -> None:
        """Make the queue's stream and consumers, once per connection."""
        made = self._queues.get(queue)
        if made is None:
            made = self._queues[queue] = asyncio.ensure_future(self._make_queue(queue))
        try:
            await asyncio.shield(made)
        except Exception:
            self._queues.pop(queue, None)
            raise

    async def _make_queue(self, queue: str) -> None:
        stream = names.stream(queue)
        config = api.StreamConfig(
            name=stream,
            description=queue,
            subjects=[f"hq.{names.token(queue)}.*"],
            retention=api.RetentionPolicy.WORK_QUEUE,
            duplicate_window=120.0,
            num_replicas=self.replicas,
        )
        try:
            await self.add_stream(config)
        except BadRequestError as err:
            if err.err_code == 10065 and await self._is_stream(stream, config.subjects):
                pass  # "subjects overlap": another client made this very stream at the same time
            elif err.err_code != 10058:  # stream name already in use with another config
                raise
        await self.led(stream)
        await asyncio.gather(
            *(self._make_consumer(queue, level) for level in (*names.LEVELS, names.DELAYED))
        )

    async def add_stream(self, config: api.StreamConfig) -> Any:
        """``add_stream``, with a refusal of its replicas said plainly (``make``: asked again
        when a cluster leaves the request unanswered)."""
        try:
            return await make(lambda: self.js.add_stream(config))
        except APIError as err:
            self.check_replicas(err)
            raise

    async def led(self, stream: str) -> None:
        """Return once ``stream`` has a leader: a replicated stream just made (by this client
        or another) elects one first, and until then refuses writes ("no response from
        stream"). Nothing to wait for on a server alone."""
        if self.replicas == 1 and "cluster" not in self.server_info:
            return
        deadline = time.monotonic() + LEADER_WAIT
        while True:
            info = await self.js.stream_info(stream)
            if info.cluster is None or info.cluster.leader or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.05)

    def check_replicas(self, err: APIError) -> None:
        """Raise a ``BrokerError`` that says so when ``err`` refused the replicas asked for."""
        if err.err_code in (NO_PEERS, NOT_CLUSTERED, INSUFFICIENT_RESOURCES):
            raise BrokerError(
                f"NATS at {self.url} cannot keep {self.replicas} replicas of a stream: "
                f"{err.description}; set replicas= in the broker URL to at most the number of "
                "JetStream servers in the cluster (1 for a server alone)"
            ) from err

    async def _is_stream(self, stream: str, subjects: list[str] | None) -> bool:
        """Whether ``stream`` exists and takes exactly ``subjects``."""
        try:
            info = await self.js.stream_info(stream)
        except NotFoundError:
            return False
        return list(info.config.subjects or []) == list(subjects or [])

    async def _make_consumer(self, queue: str, level: str) -> None:
        config = api.ConsumerConfig(
            durable_name=names.durable(level),
            filter_subject=names.subject(queue, level),
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=self.ack_wait,
            max_deliver=-1,
            max_ack_pending=1 if level == names.QUARANTINE else -1,
            max_waiting=4096,
        )
        try:
            await make(lambda: self.js.add_consumer(names.stream(queue), config))
        except BadRequestError as err:
            if err.err_code not in (10013, 10148):  # exists with another config
                raise

    async def queue_exists(self, queue: str) -> bool:
        if queue in self._queues:
            return True
        try:
            await self.js.stream_info(names.stream(queue))
        except NotFoundError:
            return False
        return True

    # -- KV ------------------------------------------------------------------------------

    async def kv(self, bucket: str = STATE_BUCKET, ttl: float | None = None) -> Any:
        kv = self._kv.get(bucket)
        if kv is None:
            config = api.KeyValueConfig(bucket=bucket, history=1, ttl=ttl, replicas=self.replicas)
            for attempt in range(1, MAKE_TRIES + 1):
                try:
                    kv = await self.js.key_value(bucket)
                    break
                except Exception:
                    pass
                try:
                    kv = await self.js.create_key_value(config)
                    break
                except nats.errors.TimeoutError:
                    if attempt == MAKE_TRIES:
                        raise
                except APIError as err:
                    self.check_replicas(err)
                    if err.err_code != 10065:
                        raise
                    # "subjects overlap": another client made this bucket at the same time
            await self.led(f"KV_{bucket}")
            self._kv[bucket] = kv
        return kv

    async def get(self, key: str, bucket: str = STATE_BUCKET) -> tuple[Any, int] | None:
        """``(value, revision)`` of ``key``, or None."""
        kv = await self.kv(bucket)
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, NotFoundError):
            return None
        if entry.value is None:
            return None
        return unpack(entry.value), entry.revision

    async def cas(
        self, key: str, change: Callable[[Any], tuple[Any, T]], bucket: str = STATE_BUCKET
    ) -> T:
        """Apply ``change(old value or None) -> (new value or None to delete, outcome)`` to
        ``key`` as one compare-and-set, again until no other writer came in between."""
        kv = await self.kv(bucket)
        while True:
            found = await self.get(key, bucket)
            old, rev = found if found is not None else (None, 0)
            new, outcome = change(old)
            try:
                if new is None:
                    if found is not None:
                        await kv.delete(key, last=rev)
                elif found is None:
                    await kv.create(key, pack(new))
                else:
                    await kv.update(key, pack(new), last=rev)
            except (KeyWrongLastSequenceError, BadRequestError):
                continue
            return outcome

    async def server_time(self) -> float:
        """The server's clock (Unix seconds): the time it stamps on a record written now (or
        by another client since, when it came in between: the bucket keeps the last one)."""
        kv = await self.kv()
        await kv.put("clock", b"")
        msg = await self.js.get_msg(f"KV_{STATE_BUCKET}", subject=f"$KV.{STATE_BUCKET}.clock")
        return float(msg.time.timestamp())

    async def keys(self, bucket: str) -> list[str]:
        """Every key of ``bucket`` that holds a value, and perhaps some deleted ones: callers
        read each with ``get``, which gives None for those.

        Read from the bucket's stream, a page of subjects per ``STREAM.INFO`` request (the
        server pages past its own limit), not with ``KeyValue.keys()``: its watcher can end the
        replay before it counted the messages it already received, and then reports no keys,
        or some of them, while more exist (nats.py issue 842), which made a worker list come
        back empty now and then. A page of 100,000 subjects can take the server seconds on a
        busy machine, hence the long wait per page."""
        await self.kv(bucket)  # made if need be
        prefix = f"$KV.{bucket}."
        keys: list[str] = []
        while True:
            asked = {"subjects_filter": f"{prefix}>", "offset": len(keys)}
            reply = await self.nc.request(
                f"$JS.API.STREAM.INFO.KV_{bucket}", json.dumps(asked).encode(), timeout=30.0
            )
            info = json.loads(reply.data)
            if "error" in info:
                APIError.from_error(info["error"])  # raises the error's class
            subjects = (info.get("state") or {}).get("subjects") or {}
            keys += [subject[len(prefix) :] for subject in subjects]
            if not subjects or len(keys) >= info.get("total", 0):
                return keys

    # -- publishing ------------------------------------------------------------------------

    async def publish_all(self, items: Sequence[tuple[str, bytes, dict[str, str] | None]]) -> None:
        """Publish ``(subject, payload, headers)`` to JetStream, pipelined, and wait for every
        acknowledgement; raise if one is refused.

        Each message is a plain publish whose reply subject names its batch and place
        (``_on_ack``): one wildcard subscription per connection takes every acknowledgement,
        where a JetStream request per message would make a token, a future and a timer each.
        Publishes whose acknowledgement does not come within ``API_TIMEOUT`` are sent again,
        once, with the same headers: under its ``Nats-Msg-Id`` JetStream stores each once
        (within two minutes). Without one, the batch fails with a ``TimeoutError``."""
        if not items:
            return
        if self._acks_prefix is None:
            await self._subscribe_acks()
        number = next(self._batch_numbers)
        batch = _Batch(len(items), asyncio.get_running_loop().create_future())
        self._batches[number] = batch
        reply = f"{self._acks_prefix}.{number}."
        try:
            await self._send(items, range(len(items)), reply)
            try:
                await asyncio.wait_for(asyncio.shield(batch.done), API_TIMEOUT)
                return
            except TimeoutError:
                missing = [i for i, acked in enumerate(batch.acked) if not acked]
                if any(names.MSG_ID not in (items[i][2] or ()) for i in missing):
                    raise nats.errors.TimeoutError from None
            await self._send(items, missing, reply)
            try:
                await asyncio.wait_for(asyncio.shield(batch.done), API_TIMEOUT)
            except TimeoutError:
                raise nats.errors.TimeoutError from None
        finally:
            del self._batches[number]
            if not batch.done.done():
                batch.done.cancel()

    async def _send(
        self,
        items: Sequence[tuple[str, bytes, dict[str, str] | None]],
        which: Iterable[int],
        reply: str,
    ) -> None:
        publish = self.nc.publish
        for i in which:
            subject, payload, headers = items[i]
            await publish(subject, payload, reply=f"{reply}{i}", headers=headers)

    async def _subscribe_acks(self) -> None:
        """The wildcard subscription that takes the acknowledgements of ``publish_all``."""
        if self._acks_ready is None:
            self._acks_ready = asyncio.ensure_future(self._subscribe_acks_now())
        ready = self._acks_ready
        try:
            await asyncio.shield(ready)
        except Exception:
            if self._acks_ready is ready and ready.done():
                self._acks_ready = None  # the next publish asks again
            raise

    async def _subscribe_acks_now(self) -> None:
        prefix = self.nc.new_inbox()
        await self.nc.subscribe(f"{prefix}.*.*", cb=self._on_ack)
        self._acks_prefix = prefix

    async def _on_ack(self, msg: Any) -> None:
        """One publish acknowledgement (or refusal) of a batch of ``publish_all``."""
        head, _, place = msg.subject.rpartition(".")  # <prefix>.<batch>.<place>
        batch = self._batches.get(int(head[head.rfind(".") + 1 :]))
        i = int(place)
        if batch is None or batch.acked[i]:  # a batch given up, or a publish sent twice
            return
        batch.acked[i] = 1
        batch.left -= 1
        error = _refusal(msg)
        if batch.done.done():
            return
        if error is not None:
            batch.done.set_exception(error)
        elif not batch.left:
            batch.done.set_result(None)

    async def wake(self, queues: Sequence[str]) -> None:
        for queue in dict.fromkeys(queues):
            await self.nc.publish(names.wake_subject(queue), b"")

    async def request(self, subject: str, payload: bytes, timeout: float = 5.0) -> Any:
        return await self.nc.request(subject, payload, timeout=timeout)

    async def settle(self, replies: Sequence[str], verb: bytes) -> None:
        """Send ``verb`` (+ACK, +TERM, -NAK, +WPI) for each delivery; the last one per consumer
        is a request whose reply says the server processed the ones before it."""
        if not replies:
            return
        last: dict[tuple[str, str], str] = {}
        for reply in replies:
            stream, consumer, _, _ = names.parse_reply(reply)
            last[(stream, consumer)] = reply
        ends = set(last.values())
        for reply in replies:
            if reply not in ends:
                await self.nc.publish(reply, verb)
        await asyncio.gather(*(self.nc.request(r, verb, timeout=10.0) for r in ends))

    async def close(self) -> None:
        await self.nc.close()


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


class _Batch:
    """What ``publish_all`` waits for: the acknowledgements still to come, which came, and the
    future that ends the wait (an error at the first refusal)."""

    __slots__ = ("acked", "done", "left")

    def __init__(self, n: int, done: asyncio.Future[None]) -> None:
        self.left = n
        self.acked = bytearray(n)
        self.done = done


def _refusal(msg: Any) -> Exception | None:
    """The error a publish acknowledgement carries, if any: JetStream's ``{"error": …}``, or
    a status reply without a body (no stream listens on the subject)."""
    data = msg.data
    if not data:
        return NoStreamResponseError()
    if b'"error"' not in data:
        return None
    reply = json.loads(data)
    if "error" not in reply:
        return None
    try:
        APIError.from_error(reply["error"])  # raises the error's class
    except APIError as err:
        return err
    return APIError()
