"""``RedisBroker``: publishing, the admin side, and the connections everything else uses."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Unpack
from urllib.parse import urlsplit

from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

import redis

from ...errors import BrokerError, ConfigurationError, EncodeError
from ...ids import new_id
from ...message import MAX_PRIORITY, Message, check_messages, check_size, encode_many
from ...records import record_in_batch
from ..base import ONCE_KEEP, Broker, BrokerOptions
from ..common import (
    unique_key_of,
)
from ..keys import (
    QUEUES,
    RESULT_BUCKET_CUT,
    queue_keys,
    rate_key,
    result_batches_key,
    result_key,
)
from ..records import QueueStats
from . import flows
from .consumer import MAX_BLOCK, RedisConsumer
from .control import _Control
from .deadletters import _DeadLetters
from .results import CLOCK_CHECK_EVERY, _ResultListener
from .scripts import (
    _PRIORITIES,
    _PRIORITY_ARG,
    _Command,
    _get_scripts,
    _lock_end,
    _publish_keys,
)
from .ticks import _Ticks
from .workers import _Workers

#: Socket timeout of the connections that block; must exceed ``MAX_BLOCK``.
BLOCKING_SOCKET_TIMEOUT = MAX_BLOCK + 10.0
#: Defaults for the other connections; ``?socket_timeout=…`` in the URL overrides them.
SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
#: Connections one broker object uses for results: the listener's, and the rest for reads.
RESULT_CONNECTIONS = 4


def _public_url(url: str) -> str:
    """``url`` without its password, for messages and ``Broker.url``."""
    return _PASSWORD.sub(lambda m: f"//{m.group(1)}@" if m.group(1) else "//", url, count=1)


_PASSWORD = re.compile(r"//([^:@/]*):[^@/]*@")

#: Seconds ``WAIT`` waits for replicas unless ``?wait_timeout=`` says otherwise.
WAIT_TIMEOUT = 1.0


def _wait_option(url: str, public: str) -> tuple[str, int, float]:
    """``url`` without hurtle's own query options, ``wait_replicas`` and ``wait_timeout``."""
    parts = urlsplit(url)
    if "wait_" not in parts.query:
        return url, 0, WAIT_TIMEOUT
    kept, replicas, timeout = [], 0, WAIT_TIMEOUT
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        try:
            if name == "wait_replicas":
                replicas = int(value)
                if replicas < 0:
                    raise ValueError(value)
            elif name == "wait_timeout":
                timeout = float(value)
                if not timeout > 0:
                    raise ValueError(value)
            else:
                kept.append(pair)
        except ValueError:
            raise ConfigurationError(
                f"bad Redis URL {public!r}: {name}={value!r}; wait_replicas is a count of "
                "replicas (0 or more), wait_timeout a number of seconds above 0"
            ) from None
    return parts._replace(query="&".join(kept)).geturl(), replicas, timeout


def _check_replicas(acked: Any, wanted: int, url: str, doing: str) -> None:
    if int(acked) < wanted:
        raise BrokerError(
            f"Redis at {url}: only {int(acked)} of the {wanted} replicas wanted "
            f"(wait_replicas) acknowledged the writes of {doing} in time; they are stored on "
            "the master and may be lost if it fails now"
        )


class RedisBroker(_Workers, _DeadLetters, _Control, _Ticks, Broker):
    """The broker contract on one Redis server (6.2 or later)."""

    _consumer_class: type[RedisConsumer] = RedisConsumer
    result_batches = True  # redis/results.py
    #: Whether results are announced on a sharded channel (``SPUBLISH``: a cluster).
    _sharded = False
    #: The server's clock less this process's, in ms, as of ``_clock_read`` (``_server_ms``).
    _clock_offset = 0
    _clock_read = -CLOCK_CHECK_EVERY

    def __init__(self, url: str, **options: Unpack[BrokerOptions]) -> None:
        super().__init__(**options)
        self.url = _public_url(url)
        self._scripts = _get_scripts()
        url, self.wait_replicas, self.wait_timeout = _wait_option(url, self.url)
        #: the URL with its password: for the heartbeat's own connections
        self._url = url
        self._connect(
            url,
            {
                "socket_timeout": SOCKET_TIMEOUT,
                "socket_connect_timeout": CONNECT_TIMEOUT,
                "socket_keepalive": True,
                # One quick retry covers a pooled connection that died with a restarted
                # server; timeouts are not retried, since the command may have run.
                "retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            },
        )

    def _connect(self, url: str, options: dict[str, Any]) -> None:
        """Open the connections: commands, blocking waits, results and their listener."""
        # Typed ``Any``: redis-py's command methods carry no annotations.
        self._client: Any
        self._blocking: Any
        db = urlsplit(url).path.lstrip("/")
        if db and not db.isdigit():
            raise ConfigurationError(
                f"bad Redis URL {self.url!r}: the database {db!r} is not a number; expected "
                "redis://[:password@]host:port/db with db an integer such as 0"
            )
        try:
            self._client = redis.Redis.from_url(url, **options)
            blocking_pool = redis.ConnectionPool.from_url(url, **options)
        except (ValueError, TypeError) as err:
            raise ConfigurationError(
                f"bad Redis URL {self.url!r}: {err}; expected redis://[:password@]host:port/db "
                "or rediss://…"
            ) from err
        self._client.connection_pool.connection_kwargs["decode_responses"] = False
        blocking_pool.connection_kwargs["decode_responses"] = False
        blocking_pool.connection_kwargs["socket_timeout"] = BLOCKING_SOCKET_TIMEOUT
        self._blocking = redis.Redis(connection_pool=blocking_pool)
        # results: waiters share a few connections (a read waits for a free one)
        results_pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=RESULT_CONNECTIONS, timeout=None, **options
        )
        results_pool.connection_kwargs["decode_responses"] = False
        self._results: Any = redis.Redis(connection_pool=results_pool)
        self._listener = _ResultListener(self._results, self.url)

    def _publishing(self, commands: list[_Command], doing: str) -> list[Any]:
        """Run a pipeline that stores messages; with ``?wait_replicas=N`` it ends with ``WAIT``
        on the same connection, and raises unless N replicas acknowledged every write."""
        if not self.wait_replicas:
            return self._pipeline_raw(commands, doing, retry=True)
        wait = ("WAIT", self.wait_replicas, max(int(self.wait_timeout * 1000), 1))
        results = self._pipeline([*commands, (wait, None)], doing)
        _check_replicas(results[-1], self.wait_replicas, self.url, doing)
        return results[:-1]

    # -- producing --------------------------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return
        payloads = encode_many(batch, self.max_message_size)
        now = time.time()
        # queue -> (ready payloads per priority, flat (eta, priority, payload) triples)
        groups: dict[str, tuple[dict[int, list[bytes]], list[Any]]] = {}
        for m, raw in zip(batch, payloads, strict=True):
            group = groups.get(m.queue)
            if group is None:
                group = groups[m.queue] = ({p: [] for p in _PRIORITIES}, [])
            try:
                if m.eta > now:
                    group[1].extend((m.eta, _PRIORITY_ARG[m.priority], raw))
                else:
                    group[0][m.priority].append(raw)
            except (KeyError, TypeError):
                raise EncodeError(
                    f"priority {m.priority!r} of task {m.task!r} is out of range: use an int "
                    f"from 0 to {MAX_PRIORITY}; nothing was enqueued"
                ) from None
        commands: list[_Command] = [(("SADD", QUEUES, *groups), None)]
        for name, (ready, delayed) in groups.items():
            args: list[Any] = [len(ready[p]) for p in _PRIORITIES]
            for p in _PRIORITIES:
                args += ready[p]
            args += delayed
            commands.append(self._call(self._scripts.publish, _publish_keys(name), args))
        self._publishing(commands, f"publishing {len(batch)} messages")

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        check_messages(messages)
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return []
        locks = [unique_key_of(m) for m in batch]
        payloads = encode_many(batch, self.max_message_size)
        # (queue, priority, eta) -> (positions in the batch, script arguments); a send_many
        # is one group
        groups: dict[tuple[str, int, float], tuple[list[int], list[Any]]] = {}
        ttl = repr(float(unique_for))
        for i, (m, lock, raw) in enumerate(zip(batch, locks, payloads, strict=True)):
            group = groups.get((m.queue, m.priority, m.eta))
            if group is None:
                priority = _PRIORITY_ARG.get(m.priority)
                if priority is None:
                    raise EncodeError(
                        f"priority {m.priority!r} of task {m.task!r} is out of range: use an "
                        f"int from 0 to {MAX_PRIORITY}; nothing was enqueued"
                    )
                group = groups[(m.queue, m.priority, m.eta)] = (
                    [],
                    [ttl, priority, repr(float(m.eta))],
                )
            group[0].append(i)
            group[1].extend((lock, m.id, raw, _lock_end(m)))
        queues = {queue for queue, _, _ in groups}
        commands: list[_Command] = [(("SADD", QUEUES, *queues), None)]
        for (name, _, _), (_, args) in groups.items():
            k = queue_keys(name)
            commands.append(
                self._call(
                    self._scripts.publish_unique,
                    (*_publish_keys(name), k.unique, k.unique_sweep),
                    args,
                )
            )
        results = self._publishing(commands, f"publishing {len(batch)} unique messages")
        out = [m.id for m in batch]
        for (positions, _), skipped in zip(groups.values(), results[1:], strict=True):
            for at in range(0, len(skipped), 2):
                holder = skipped[at + 1]
                out[positions[skipped[at] - 1]] = (
                    holder.decode() if isinstance(holder, bytes) else str(holder)
                )
        return out

    def publish_once(
        self,
        messages: Sequence[Message],
        payloads: Sequence[bytes] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        check_messages(messages)
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return
        if payloads is None:
            payloads = encode_many(batch, self.max_message_size)
        else:
            check_size(batch, payloads, self.max_message_size)
        # queue -> unit key (its first message's id in that queue) -> (priority, eta) -> payloads
        groups: dict[str, dict[str, dict[tuple[int, float], list[bytes]]]] = {}
        at = 0
        for size in units if units is not None else itertools.repeat(1, len(batch)):
            mine: dict[str, dict[tuple[int, float], list[bytes]]] = {}  # this unit's, by queue
            same_of: dict[tuple[str, int, float], list[bytes]] = {}
            for m, raw in zip(batch[at : at + size], payloads[at : at + size], strict=True):
                same = same_of.get((m.queue, m.priority, m.eta))
                if same is None:  # once per queue, priority and eta of the unit
                    if m.priority not in _PRIORITY_ARG:
                        raise EncodeError(
                            f"priority {m.priority!r} of task {m.task!r} is out of range: use an "
                            f"int from 0 to {MAX_PRIORITY}; nothing was enqueued"
                        )
                    unit = mine.get(m.queue)
                    if unit is None:
                        unit = mine[m.queue] = groups.setdefault(m.queue, {}).setdefault(m.id, {})
                    same = same_of[(m.queue, m.priority, m.eta)] = unit.setdefault(
                        (m.priority, m.eta), []
                    )
                same.append(raw)
            at += size
        if at != len(batch):
            raise ValueError(f"units add up to {at} messages, not the {len(batch)} given")
        commands: list[_Command] = [(("SADD", QUEUES, *groups), None)]
        head = [str(ONCE_KEEP), repr(time.time())]
        for name, queue in groups.items():
            args: list[Any] = list(head)
            for key, unit in queue.items():
                args += (key, str(len(unit)))
                for (priority, eta), raws in unit.items():
                    args += (_PRIORITY_ARG[priority], repr(float(eta)), str(len(raws)), *raws)
            keys = (*_publish_keys(name), queue_keys(name).sent)
            commands.append(self._call(self._scripts.publish_once, keys, args))
        self._publishing(commands, f"publishing {len(batch)} messages once")

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        if not requests:
            return []
        script = self._scripts.rate
        commands = [
            self._call(script, (rate_key(key),), (limit, repr(float(period)), wanted))
            for key, limit, period, wanted in requests
        ]
        return [
            (int(granted), float(wait))
            for granted, wait in self._pipeline(
                commands, f"taking tokens of {len(requests)} rate limits"
            )
        ]

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        if not payloads:
            return
        args: list[Any] = [len(payloads), *([0] * MAX_PRIORITY), *payloads]
        self._publishing(
            [
                (("SADD", QUEUES, queue), None),
                self._call(self._scripts.publish, _publish_keys(queue), args),
            ],
            f"publishing {len(payloads)} raw payloads to {queue!r}",
        )

    # -- consuming --------------------------------------------------------------------------

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> RedisConsumer:
        if isinstance(queues, str):
            queues = [queues]
        if not queues:
            raise ConfigurationError("a consumer needs at least one queue name")
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{new_id()}"
        return self._consumer_class(self, tuple(queues), worker_id)

    # -- admin ------------------------------------------------------------------------------

    def queues(self) -> list[str]:
        names = self._pipeline([(("SMEMBERS", QUEUES), None)], "listing queues")[0]
        return sorted(n.decode() for n in names)

    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        names = self.queues() if queues is None else list(queues)
        if not names:
            return {}
        commands = []
        for name in names:
            k = queue_keys(name)
            keys = (
                *k.ready,
                k.delayed,
                k.workers,
                k.dead,
                k.quarantine,
                k.paused,
                k.inflight_prefix,
            )
            commands.append(self._call(self._scripts.stats, keys, ()))
        results = self._pipeline(commands, "reading queue stats")
        return {
            name: QueueStats(ready=r[0], delayed=r[1], in_flight=r[2], dead=r[3], paused=bool(r[4]))
            for name, r in zip(names, results, strict=True)
        }

    def recover(self) -> int:
        return self._heartbeat(self.queues(), "", 0.0)[0]

    def _stored_purge(self, queues: Sequence[str]) -> int:
        """``purge.lua`` per queue (each its own hash tag), pipelined: one round trip."""
        commands = []
        for queue in queues:
            k = queue_keys(queue)
            commands.append(
                self._call(self._scripts.purge, (*k.ready, k.delayed, k.quarantine, k.wake), ())
            )
        doing = f"purging the waiting messages of {queues[0]!r}"
        return sum(int(n) for n in self._pipeline(commands, doing))

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        return flows.chord_results(self, id, total)

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        try:
            members: Any = self._client.zrange(
                queue_keys(queue).delayed, 0, limit - 1, withscores=True
            )
        except redis.RedisError as err:
            self._fail(err, f"listing the delayed messages of {queue!r}")
        # A member is "P:SEQ:" + the message's bytes (see keys.py): strip the two fields.
        return [(float(eta), bytes(m).split(b":", 2)[2]) for m, eta in members]

    def _server_ms(self) -> int:
        """Now on the server's clock, in ms, from this process's clock and their difference,
        read with ``TIME`` at most every ``CLOCK_CHECK_EVERY`` seconds (the expiries of
        results are the server's). When the read fails, the last difference stands."""
        mono = time.monotonic()
        if mono - self._clock_read >= CLOCK_CHECK_EVERY:
            self._clock_read = mono
            before = time.time()
            with contextlib.suppress(redis.RedisError):
                reply: Any = self._client.execute_command("TIME")
                if isinstance(reply, dict):  # a cluster: one reply per node asked
                    reply = next(iter(reply.values()))
                after = time.time()
                server = int(reply[0]) * 1000 + int(reply[1]) // 1000
                self._clock_offset = server - int((before + after) * 500)
        return int(time.time() * 1000) + self._clock_offset

    def get_result(self, id: str) -> bytes | None:
        script = self._scripts.result_get
        key = result_key(id)
        # an id of up to RESULT_BUCKET_CUT bytes is in no batch (and its key's tag is empty:
        # a key named after it could be in another slot)
        keys = (key, result_batches_key(id) if len(id.encode()) > RESULT_BUCKET_CUT else key)
        args = ("EVALSHA", script.sha, 2, *keys, id, RESULT_BUCKET_CUT)
        try:
            try:
                payload: Any = self._results.execute_command(*args)
            except NoScriptError:
                self._results.script_load(script.source)
                payload = self._results.execute_command(*args)
        except redis.RedisError as err:
            self._fail(err, f"reading the result of {id}")
        if isinstance(payload, list):  # (a batch stored whole, the record's place in it)
            return record_in_batch(memoryview(payload[0])[int(payload[2]) - 1 :], int(payload[1]))
        return None if payload is None else bytes(payload)

    def watch_results(
        self, ids: Sequence[str], wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        return self._listener.watch(ids, wake)

    def close(self) -> None:
        self._listener.close()
        self._client.close()
        self._blocking.connection_pool.disconnect()
        self._blocking.close()
        self._results.connection_pool.disconnect()
        self._results.close()
