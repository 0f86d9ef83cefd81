"""``redis://host:port/db`` (and ``rediss://``): the production broker.

What this module owns: turning the broker contract into calls of the Lua scripts in ``lua/``, one
round trip per batch, and turning redis-py errors into ``BrokerError``. Key names come from
``keys``; every state change is one script touching the keys of one queue (one hash tag), so a
consumer of several queues runs one script per queue and Redis Cluster can come later.

How it works, in short:

* publish: one ``publish.lua`` call per queue, pipelined; ready messages are ``RPUSH``-ed many per
  call, delayed ones go to a zset scored by eta; a few wake-up tokens are pushed.
* fetch: ``fetch.lua`` promotes due delayed messages, ``LPOP``-s up to N (highest priority first),
  records them in this worker's in-flight hash and refreshes its heartbeat. When nothing is ready
  the consumer blocks server-side (``BLPOP`` on the queues' wake lists) until a publish pushes a
  token, the next delayed message is due, or the timeout ends. No polling loop. Each fetch
  carries a token, kept until its reply is read: a fetch sent again after a lost reply first
  hands back what the lost one took, so nothing stays held by a worker that never saw it.
* ack: one ``HDEL`` of the receipts per queue. Receipts are integers ``seq * 10 + priority``.
* results: ``Consumer.ack(deliveries, results)`` runs ``results.lua`` (a ``SET … PX`` per
  result, then one ``PUBLISH`` of the batch's ids on ``hurtle:results``) before the ack scripts,
  in the same pipeline.
  Waiters do not poll: one listener thread per broker object, on one connection, subscribes to
  that channel and wakes the waiters of the ids it hears; reads of records go through a small
  pool of their own (``RESULT_CONNECTIONS``), so a thousand waiters use a handful of connections.
* limits: ``rate.lua`` (GCRA tokens) and ``slots.lua`` (concurrency slots held per worker),
  one call per key, pipelined; unique locks: ``publish_unique.lua`` takes them and publishes in
  one script per queue, ``unique_release.lua`` ends them. Deferral reuses ``retry.lua``.
* crash recovery: ``heartbeat.lua`` records the worker's deadline per queue (server time plus
  the worker's own ``heartbeat_timeout``; a fetch refreshes it too) and hands back, at the front
  of the queue, what workers whose deadline passed held. It counts their deaths per message: a
  message recovered twice is quarantined and let out alone, and one whose workers keep dying
  becomes a dead letter past ``max_recoveries`` (see the script's header).

Nothing here decodes a payload: garbage bytes come out of ``fetch`` like any message. Bad data
that something else wrote into Redis never stops a queue: a delayed member that is not
``P:SEQ:payload`` goes to the queue's dead letters as it was, and a retry whose message has a
priority outside 0-9 or a non-finite eta dead-letters the delivery as delivered, with the reason
(rather than clamp the priority: the message would run in an order nobody chose).

What runs twice. The clients resend a command once when its connection fails (a pooled
connection that died with a restarted server); timeouts are not resent. So a command whose reply
was lost may run twice, and so may one that the caller tries again after a ``BrokerError``:

* fetch: takes once — the token above;
* heartbeat, close: no harm done twice;
* ack, retry, dead letter, release: once — a delivery is settled one way only, and settling one
  already settled, or recovered from a worker declared dead, changes nothing (the copy that went
  back to the queue is the one that lives);
* publish: at least once — a batch whose reply was lost may be stored twice, and a publish that
  raised may have been stored: calling it again can duplicate messages, never lose them;
* a retry into another queue (another hash tag, so no one script can do it): the new attempt is
  stored first and the delivery settled only once that succeeded, so a failure in between leaves
  the message in both queues (it runs twice), never in neither.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import socket
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from importlib import resources
from itertools import repeat
from operator import attrgetter
from typing import Any, NoReturn
from urllib.parse import urlsplit

from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

import redis

from ..errors import BrokerError, ConfigurationError, EncodeError
from ..ids import new_id
from ..message import MAX_PRIORITY, Message, check_messages, encode_many
from ..settings import DEFAULT_DEAD_LETTER_MAX, DEFAULT_DEAD_LETTER_TTL
from .base import (
    Broker,
    Consumer,
    DeadLetter,
    Delivery,
    QueueStats,
    StoredResult,
    check_dead_letter_limits,
    check_tick_claim,
    log_trimmed,
    unique_key_of,
)
from .keys import (
    BATCH_BITS,
    BATCH_MASK,
    QUEUES,
    RESULTS_CHANNEL,
    TOTALS,
    WORKER_DEADLINES,
    WORKER_REPORT,
    QueueKeys,
    queue_keys,
    rate_key,
    result_key,
    slot_keys,
)
from .reports import KINDS, TaskCounts, WorkerReport, decode_report, encode_report

__all__ = ["RedisBroker", "RedisConsumer"]

log = logging.getLogger(__name__)

#: Longest single ``BLPOP``; a longer ``fetch`` timeout blocks in several steps of this.
MAX_BLOCK = 5.0
#: Socket timeout of the connections that block; must exceed ``MAX_BLOCK``.
BLOCKING_SOCKET_TIMEOUT = MAX_BLOCK + 10.0
#: Defaults for the other connections; ``?socket_timeout=…`` in the URL overrides them.
SOCKET_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
#: Connections one broker object uses for results: the listener's, and the rest for reads.
RESULT_CONNECTIONS = 4
#: Due delayed messages promoted per fetch, at least (more when the batch is larger).
PROMOTE_LIMIT = 1000

_PRIORITIES = range(MAX_PRIORITY + 1)
_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)


class _Script:
    """One Lua file, run with ``EVALSHA`` (loaded again on ``NOSCRIPT``)."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = _read_lua(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()


def _read_lua(name: str) -> str:
    text = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return _INCLUDE.sub(lambda m: _read_lua(m.group(1)), text)


class _Scripts:
    """Every script, read once per process."""

    def __init__(self) -> None:
        self.publish = _Script("publish")
        self.fetch = _Script("fetch")
        self.ack = _Script("ack")
        self.retry = _Script("retry")
        self.dead_letter = _Script("dead_letter")
        self.release = _Script("release")
        self.held = _Script("held")
        self.heartbeat = _Script("heartbeat")
        self.close = _Script("close")
        self.stats = _Script("stats")
        self.dead_list = _Script("dead_list")
        self.dead_delete = _Script("dead_delete")
        self.dead_purge = _Script("dead_purge")
        self.claim_tick = _Script("claim_tick")
        self.results = _Script("results")
        self.rate = _Script("rate")
        self.slots = _Script("slots")
        self.publish_unique = _Script("publish_unique")
        self.unique_release = _Script("unique_release")

    def all(self) -> list[_Script]:
        return [v for v in vars(self).values() if isinstance(v, _Script)]


_scripts: _Scripts | None = None


def _get_scripts() -> _Scripts:
    global _scripts
    if _scripts is None:
        _scripts = _Scripts()
    return _scripts


def _public_url(url: str) -> str:
    """``url`` without its password, for messages and ``Broker.url``."""
    return _PASSWORD.sub(lambda m: f"//{m.group(1)}@" if m.group(1) else "//", url, count=1)


_PASSWORD = re.compile(r"//([^:@/]*):[^@/]*@")


# One command of a pipeline: (args of execute_command, script or None).
_Command = tuple[tuple[Any, ...], "_Script | None"]


class RedisBroker(Broker):
    """The broker contract on one Redis server (6.2 or later)."""

    def __init__(
        self,
        url: str,
        *,
        heartbeat_timeout: float = 20.0,
        dead_letter_max: int = DEFAULT_DEAD_LETTER_MAX,
        dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL,
        max_recoveries: int = 3,
    ) -> None:
        self.dead_letter_max, self.dead_letter_ttl = check_dead_letter_limits(
            dead_letter_max, dead_letter_ttl
        )
        self.url = _public_url(url)
        self._url = url  # with its password: for the heartbeat's own connections
        self.heartbeat_timeout = heartbeat_timeout
        self.max_recoveries = max_recoveries
        self._scripts = _get_scripts()
        options: dict[str, Any] = {
            "socket_timeout": SOCKET_TIMEOUT,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_keepalive": True,
            # One quick retry covers a pooled connection that died with a restarted server;
            # timeouts are not retried, since the command may have run.
            "retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        }
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
        self._results = redis.Redis(connection_pool=results_pool)
        self._listener = _ResultListener(self._results, self.url)

    # -- plumbing ---------------------------------------------------------------------------

    def _fail(self, err: redis.RedisError, doing: str) -> NoReturn:
        if isinstance(err, redis.AuthenticationError):
            raise BrokerError(
                f"Redis at {self.url} refused the credentials while {doing}: {err}; check the "
                "user and password in the broker URL"
            ) from err
        if isinstance(err, redis.ConnectionError):
            raise BrokerError(
                f"cannot reach Redis at {self.url} while {doing}: {err}; is redis-server "
                "running there?"
            ) from err
        if isinstance(err, redis.TimeoutError):
            raise BrokerError(
                f"Redis at {self.url} did not answer in time while {doing}: {err}"
            ) from err
        raise BrokerError(f"Redis at {self.url} failed while {doing}: {err}") from err

    def _eval(self, script: _Script, keys: Sequence[str], args: Sequence[Any], doing: str) -> Any:
        """Run one script in one round trip (two more if the server forgot the script)."""
        client = self._client
        try:
            try:
                return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                client.script_load(script.source)
                return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.RedisError as err:
            self._fail(err, doing)

    def _pipeline(self, commands: list[_Command], doing: str) -> list[Any]:
        """Run commands in one round trip; scripts the server forgot are loaded and rerun."""
        if len(commands) == 1:
            cmd, script = commands[0]
            if script is not None:
                return [self._eval(script, cmd[3 : 3 + cmd[2]], cmd[3 + cmd[2] :], doing)]
            try:
                return [self._client.execute_command(*cmd)]
            except redis.RedisError as err:
                self._fail(err, doing)
        try:
            pipe = self._client.pipeline(transaction=False)
            for cmd, _ in commands:
                pipe.execute_command(*cmd)
            results: list[Any] = pipe.execute(raise_on_error=False)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:  # the server restarted or SCRIPT FLUSH: those commands did not run
                for script in {id(s): s for _, s in commands if s is not None}.values():
                    self._client.script_load(script.source)
                pipe = self._client.pipeline(transaction=False)
                for i in missing:
                    pipe.execute_command(*commands[i][0])
                for i, r in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                    results[i] = r
        except redis.RedisError as err:
            self._fail(err, doing)
        for r in results:
            if isinstance(r, redis.RedisError):
                self._fail(r, doing)
        return results

    def _call(self, script: _Script, keys: Sequence[str], args: Sequence[Any]) -> _Command:
        return ("EVALSHA", script.sha, len(keys), *keys, *args), script

    # -- producing --------------------------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return
        payloads = encode_many(batch)
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
        self._pipeline(commands, f"publishing {len(batch)} messages")

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        check_messages(messages)
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return []
        locks = [unique_key_of(m) for m in batch]
        payloads = encode_many(batch)
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
            group[1].extend((lock, m.id, raw))
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
        results = self._pipeline(commands, f"publishing {len(batch)} unique messages")
        out = [m.id for m in batch]
        for (positions, _), skipped in zip(groups.values(), results[1:], strict=True):
            for at in range(0, len(skipped), 2):
                holder = skipped[at + 1]
                out[positions[skipped[at] - 1]] = (
                    holder.decode() if isinstance(holder, bytes) else str(holder)
                )
        return out

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
        self._pipeline(
            [
                (("SADD", QUEUES, queue), None),
                self._call(self._scripts.publish, _publish_keys(queue), args),
            ],
            f"publishing {len(payloads)} raw payloads to {queue!r}",
        )

    def claim_tick(self, queue: str, name: str, tick: float, messages: Sequence[Message]) -> bool:
        check_tick_claim(queue, tick, messages)
        check_messages(messages)
        payloads = encode_many(list(messages))
        now = time.time()
        ready: dict[int, list[bytes]] = {p: [] for p in _PRIORITIES}
        delayed: list[Any] = []
        for m, raw in zip(messages, payloads, strict=True):
            if m.eta > now:
                delayed.extend((m.eta, _PRIORITY_ARG[m.priority], raw))
            else:
                ready[m.priority].append(raw)
        args: list[Any] = [repr(float(tick)), *(len(ready[p]) for p in _PRIORITIES)]
        for p in _PRIORITIES:
            args += ready[p]
        args += delayed
        keys = (queue_keys(queue).schedule(name), *_publish_keys(queue))
        _, won = self._pipeline(
            [(("SADD", QUEUES, queue), None), self._call(self._scripts.claim_tick, keys, args)],
            f"claiming tick {tick!r} of schedule {name!r}",
        )
        return bool(won)

    def last_tick(self, queue: str, name: str) -> float | None:
        try:
            raw = self._client.get(queue_keys(queue).schedule(name))
        except redis.RedisError as err:
            self._fail(err, f"reading the last tick of schedule {name!r}")
        return None if raw is None else float(raw)

    # -- consuming --------------------------------------------------------------------------

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> RedisConsumer:
        if isinstance(queues, str):
            queues = [queues]
        if not queues:
            raise ConfigurationError("a consumer needs at least one queue name")
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}:{new_id()}"
        return RedisConsumer(self, tuple(queues), worker_id)

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
            keys = (*k.ready, k.delayed, k.workers, k.dead, k.quarantine)
            commands.append(self._call(self._scripts.stats, keys, (k.inflight_prefix,)))
        results = self._pipeline(commands, "reading queue stats")
        return {
            name: QueueStats(ready=r[0], delayed=r[1], in_flight=r[2], dead=r[3])
            for name, r in zip(names, results, strict=True)
        }

    def recover(self) -> int:
        return self._heartbeat(self.queues(), "", 0.0)[0]

    def workers(self) -> list[WorkerReport]:
        now = time.time()
        live = self._pipeline(
            [(("ZRANGEBYSCORE", WORKER_DEADLINES, repr(now), "+inf", "WITHSCORES"), None)],
            "reading workers' deadlines",
        )[0]
        # redis-py pairs the scores up itself (RESP2 and RESP3 alike)
        deadlines = {member.decode(): float(score) for member, score in live}
        if not deadlines:
            return []
        ids = sorted(deadlines)
        records = self._pipeline(
            [(("GET", WORKER_REPORT + worker_id), None) for worker_id in ids],
            "reading workers' reports",
        )
        out = []
        for worker_id, record in zip(ids, records, strict=True):
            report = record and decode_report(record, deadlines[worker_id])
            if report:
                out.append(report)
        return out

    def totals(self) -> list[TaskCounts]:
        raw = self._pipeline([(("HGETALL", TOTALS), None)], "reading the cluster's counters")[0]
        rows: dict[tuple[str, str], list[int]] = {}
        for field, value in raw.items():
            queue, task, kind = field.decode().split("\x1f")
            if kind in KINDS:
                rows.setdefault((queue, task), [0, 0, 0, 0])[KINDS.index(kind)] = int(value)
        return [TaskCounts(q, t, *row) for (q, t), row in sorted(rows.items())]

    def _heartbeat(
        self,
        queues: Sequence[str],
        worker_id: str,
        timeout: float,
        report: WorkerReport | None = None,
    ) -> tuple[int, bool]:
        """Push ``worker_id``'s deadline to now + ``timeout`` (unless it is ``""``) and recover
        ``queues`` from the workers whose deadline passed; store ``report``, if any, in the same
        round trip. Returns how many deliveries were recovered, and whether messages wait in
        quarantine."""
        if not queues:
            return 0, False
        commands: list[_Command] = []
        if report is not None:
            now = time.time()
            commands += [
                (
                    (
                        "SET",
                        WORKER_REPORT + worker_id,
                        encode_report(report),
                        "PX",
                        max(int(timeout * 1000), 1),
                    ),
                    None,
                ),
                (("ZADD", WORKER_DEADLINES, repr(now + timeout), worker_id), None),
                # dead workers' entries; their reports expire by themselves
                (("ZREMRANGEBYSCORE", WORKER_DEADLINES, "-inf", f"({now!r}"), None),
            ]
            for c in report.delta:
                for kind in KINDS:
                    if n := getattr(c, kind):
                        field = f"{c.queue}\x1f{c.task}\x1f{kind}"
                        commands.append((("HINCRBY", TOTALS, field, n), None))
        n_report = len(commands)
        for name in queues:
            k = queue_keys(name)
            args = (worker_id, repr(float(timeout)), k.inflight_prefix, self.max_recoveries)
            keys = (
                *k.ready,
                k.workers,
                k.wake,
                k.quarantine,
                k.deaths,
                k.probes,
                k.probe,
                k.dead,
                k.dead_raw,
                k.dead_reason,
                k.seq,
            )
            commands.append(self._call(self._scripts.heartbeat, keys, args))
        results = self._pipeline(commands, "recording a heartbeat and recovering")[n_report:]
        return sum(r[0] for r in results), any(r[1] for r in results)

    def dead_letters(self, queue: str, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        k = queue_keys(queue)
        flat = self._eval(
            self._scripts.dead_list,
            (k.dead, k.dead_raw, k.dead_reason),
            (offset, limit),
            f"listing dead letters of {queue!r}",
        )
        return [
            DeadLetter(
                id=flat[i].decode(),
                queue=queue,
                failed_at=float(flat[i + 1]),
                reason=flat[i + 2].decode("utf-8", "replace"),
                raw=flat[i + 3],
            )
            for i in range(0, len(flat), 4)
        ]

    def delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        k = queue_keys(queue)
        return int(
            self._eval(
                self._scripts.dead_delete,
                (k.dead, k.dead_raw, k.dead_reason),
                list(ids),
                f"deleting dead letters of {queue!r}",
            )
        )

    def purge_dead(self, queue: str) -> int:
        k = queue_keys(queue)
        return int(
            self._eval(
                self._scripts.dead_purge,
                (k.dead, k.dead_raw, k.dead_reason),
                (),
                f"purging dead letters of {queue!r}",
            )
        )

    def get_result(self, id: str) -> bytes | None:
        try:
            payload: Any = self._results.get(result_key(id))
        except redis.RedisError as err:
            self._fail(err, f"reading the result of {id}")
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


class _ResultListener:
    """One thread on one connection, subscribed to ``RESULTS_CHANNEL`` while anyone waits,
    waking the waiters of the ids each announcement names.

    Each (re)subscription wakes every waiter, so that one that started watching before the
    subscription took effect re-reads its record: nothing announced in between is missed. A
    forked child starts a listener of its own (the parent's thread did not come along).
    """

    def __init__(self, client: Any, url: str) -> None:
        self._client = client
        self._url = url
        self._lock = threading.Lock()
        self._watchers: dict[str, list[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    def watch(self, ids: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        if self._pid != os.getpid():  # forked: the thread and any lock holder stayed behind
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._watchers = {}
            self._thread = None
        with self._lock:
            for id_ in ids:
                self._watchers.setdefault(id_, []).append(wake)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="hurtle-results", daemon=True
                )
                self._thread.start()

        def stop() -> None:
            with self._lock:
                for id_ in ids:
                    watchers = self._watchers.get(id_)
                    if watchers is not None:
                        watchers.remove(wake)
                        if not watchers:
                            del self._watchers[id_]

        return stop

    def _wake(self, ids: Iterable[str] | None) -> None:
        with self._lock:
            if ids is None:
                wakes = [w for ws in self._watchers.values() for w in ws]
            else:
                wakes = [w for id_ in ids for w in self._watchers.get(id_, ())]
        for wake in wakes:
            wake()

    def _run(self) -> None:
        backoff = 0.1
        while not self._closed:
            pubsub = self._client.pubsub()
            try:
                pubsub.subscribe(RESULTS_CHANNEL)
                while not self._closed:
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "message":
                        self._wake(message["data"].decode("ascii", "replace").split())
                    elif message["type"] == "subscribe":
                        self._wake(None)
                    backoff = 0.1
            except Exception as err:  # redis-py's errors, or its state after a disconnect
                if self._closed:
                    return
                log.warning(
                    "lost the result announcements of Redis at %s (%s); subscribing again in %.1fs",
                    self._url,
                    err,
                    backoff,
                )
                self._wake(None)  # waiters re-read meanwhile
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def close(self) -> None:
        """Stop; the thread ends at its next read, which the pool's disconnect cuts short."""
        self._closed = True


_PRIORITY_ARG = {p: str(p) for p in _PRIORITIES}


def _beat_reporting(consumer: RedisConsumer, broker: RedisBroker) -> bool:
    """``consumer``'s heartbeat through ``broker``'s connections, with its report if any."""
    reporter = consumer.reporter
    report = reporter.report() if reporter is not None else None
    pending = broker._heartbeat(
        list(consumer._targets), consumer.worker_id, consumer.heartbeat_timeout, report
    )[1]
    if report is not None and reporter is not None:
        reporter.confirm(report)
    return pending


def _unstorable(message: Message) -> str | None:
    """Why ``message`` cannot be stored as a retry (a field out of range), or ``None``."""
    priority = message.priority
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        return (
            f"priority {priority!r} of task {message.task!r} is out of range (an int from 0 "
            f"to {MAX_PRIORITY})"
        )
    if not math.isfinite(message.eta):
        return f"eta {message.eta!r} of task {message.task!r} is not a finite time"
    return None


def _publish_keys(name: str) -> tuple[str, ...]:
    k = queue_keys(name)
    return (*k.ready, k.delayed, k.wake, k.seq)


@lru_cache(maxsize=64)
def _packed_range(start: int, n: int) -> bytes:
    return struct.pack(f"<{n}I", *range(start, start + n))


_QUEUE_OF = attrgetter("queue")
_RECEIPT_OF = attrgetter("receipt")


def _ack_args(receipts: list[int]) -> list[Any]:
    """``ack.lua`` arguments: per batch its id, a count and the packed message indexes."""
    first, n = receipts[0], len(receipts)
    if (
        receipts[-1] - first == n - 1
        and first >> BATCH_BITS == receipts[-1] >> BATCH_BITS
        and receipts == list(range(first, first + n))
    ):  # the usual case: a run of one fetched batch, in order
        return [first >> BATCH_BITS, n, _packed_range(first & BATCH_MASK, n)]
    unique = set(receipts)
    ordered = sorted(unique) if len(unique) != len(receipts) else sorted(receipts)
    args: list[Any] = []
    n = len(ordered)
    start = 0
    while start < n:
        batch = ordered[start] >> BATCH_BITS
        end = bisect_left(ordered, (batch + 1) << BATCH_BITS, start)
        indexes = [r & BATCH_MASK for r in ordered[start:end]]
        args += (batch, end - start, struct.pack(f"<{end - start}I", *indexes))
        start = end
    return args


def _results_commands(broker: RedisBroker, results: Sequence[StoredResult]) -> list[_Command]:
    """One ``results.lua`` call per distinct ttl (most batches have one)."""
    by_ttl: dict[float, list[StoredResult]] = {}
    for r in results:
        by_ttl.setdefault(r.ttl, []).append(r)
    script = broker._scripts.results
    commands = []
    for ttl, group in by_ttl.items():
        ids = [r.id for r in group]
        commands.append(
            broker._call(
                script,
                [result_key(i) for i in ids],
                [
                    RESULTS_CHANNEL,
                    " ".join(ids),
                    max(int(ttl * 1000), 1),
                    *[r.payload for r in group],
                ],
            )
        )
    return commands


class _Target:
    """One queue of a consumer, with its script keys built once."""

    __slots__ = ("fetch_keys", "fetched", "inflight", "keys", "name", "token")

    def __init__(self, name: str, worker_id: str) -> None:
        self.name = name
        self.keys: QueueKeys = queue_keys(name)
        k = self.keys
        self.inflight = k.inflight(worker_id)
        self.fetched = k.fetched(worker_id)
        self.fetch_keys = (
            *k.ready,
            k.delayed,
            self.inflight,
            k.workers,
            k.wake,
            k.seq,
            self.fetched,
            k.dead,
            k.dead_raw,
            k.dead_reason,
        )
        #: The token of the next fetch from this queue: a new one once a reply has been read.
        self.token = new_id()


class RedisConsumer(Consumer):
    """One worker's session: what it holds is under ``hurtle:{queue}:inflight:<worker_id>``."""

    def __init__(self, broker: RedisBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        #: This worker's own timeout: its deadline, as other workers see it, is a beat plus this.
        self.heartbeat_timeout = broker.heartbeat_timeout
        self._timeout_arg = repr(float(broker.heartbeat_timeout))
        self._targets = {name: _Target(name, worker_id) for name in dict.fromkeys(queues)}
        self._reading = list(self._targets.values())
        self._wake_keys = [t.keys.wake for t in self._reading]
        self._fetch = broker._scripts.fetch
        # a fetch script sent by ``prefetch`` whose reply is still to be read: (connection, want)
        self._pending: tuple[Any, int] | None = None
        #: concurrency key -> slots this consumer holds (their deadlines move with each beat)
        self._slots: dict[str, int] = {}

    def _target(self, queue: str) -> _Target:
        target = self._targets.get(queue)
        if target is None:  # a delivery from a queue this consumer does not read: still settle it
            target = self._targets[queue] = _Target(queue, self.worker_id)
        return target

    def prefetch(self, max_count: int) -> None:
        if self._pending is not None or len(self._reading) != 1 or max_count <= 0:
            return  # several queues are read in turn: nothing to overlap
        max_count = min(max_count, BATCH_MASK)
        pool = self.broker._client.connection_pool
        # Whatever fails here, the next fetch meets the problem and reports it; if the command
        # did reach the server, that fetch carries the same token and hands the batch back.
        try:
            conn = pool.get_connection()
        except (redis.RedisError, OSError):
            return
        try:
            conn.send_command(*self._fetch_command(self._reading[0], max_count))
        except (redis.RedisError, OSError):
            pool.release(conn)
            conn.disconnect()
            return
        self._pending = (conn, max_count)

    def take_prefetched(self) -> list[Delivery]:
        if self._pending is None:
            return []
        try:
            return self._collect()
        except redis.RedisError as err:
            self.broker._fail(err, f"fetching from {list(self.queues)}")

    def _fetch_command(self, target: _Target, want: int) -> tuple[Any, ...]:
        return (
            "EVALSHA",
            self._fetch.sha,
            len(target.fetch_keys),
            *target.fetch_keys,
            want,
            self.worker_id,
            max(PROMOTE_LIMIT, want),
            target.token,
            self._timeout_arg,
        )

    def _collect(self) -> list[Delivery]:
        """Read the reply of the fetch ``prefetch`` sent."""
        assert self._pending is not None
        conn, want = self._pending
        self._pending = None
        pool = self.broker._client.connection_pool
        try:
            res = conn.read_response()
        except NoScriptError:
            pool.release(conn)
            return self._take(want)[0]
        except BaseException:
            conn.disconnect()  # a reply half read: the connection cannot be reused
            pool.release(conn)
            raise
        pool.release(conn)
        target = self._reading[0]
        target.token = new_id()
        return self._deliveries(target.name, res)

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        if max_count <= 0:
            return []
        if self._pending is not None:
            try:
                out = self._collect()
            except redis.RedisError:
                out = []  # the reply is lost: ``_take`` sends the fetch again, same token
            if out:
                return out
        max_count = min(max_count, BATCH_MASK)
        deadline = time.monotonic() + timeout
        while True:
            out, wait_ms = self._take(max_count)
            if out:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            block = min(left, MAX_BLOCK)
            if wait_ms >= 0:
                block = min(block, wait_ms / 1000)
            # BLPOP takes seconds with millisecond resolution, and 0 would mean forever.
            block = max(math.ceil(block * 1000), 1) / 1000
            try:
                self.broker._blocking.execute_command("BLPOP", *self._wake_keys, block)
            except redis.RedisError as err:
                self.broker._fail(err, f"waiting for messages on {list(self.queues)}")

    def _take(self, max_count: int) -> tuple[list[Delivery], int]:
        """Run the fetch script on each queue in order until ``max_count`` are taken."""
        out: list[Delivery] = []
        wait_ms = -1
        for target in self._reading:
            try:
                res = self.broker._eval(
                    self._fetch,
                    target.fetch_keys,
                    (
                        max_count - len(out),
                        self.worker_id,
                        max(PROMOTE_LIMIT, max_count),
                        target.token,
                        self._timeout_arg,
                    ),
                    f"fetching from {target.name!r}",
                )
            except BrokerError:
                if out:  # held already: hand them over; this queue is asked again next time
                    return out, 0
                raise
            target.token = new_id()
            if len(res) > 1:
                out += self._deliveries(target.name, res)
                if len(out) >= max_count:
                    break
            elif res[0] >= 0 and (wait_ms < 0 or res[0] < wait_ms):
                wait_ms = res[0]
        return out, wait_ms

    @staticmethod
    def _deliveries(name: str, res: list[Any]) -> list[Delivery]:
        """Deliveries from a fetch script's reply: one batch per priority, id then payloads."""
        out: list[Delivery] = []
        for at in range(1, len(res), 2):
            base = res[at] << BATCH_BITS
            raws = res[at + 1]
            n = len(raws)
            out += map(Delivery, repeat(name, n), raws, range(base, base + n))
        return out

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        if not deliveries and not results:
            return
        queues = set(map(_QUEUE_OF, deliveries))
        if len(queues) <= 1:
            groups = {queues.pop(): list(map(_RECEIPT_OF, deliveries))} if queues else {}
        else:
            groups = {}
            for d in deliveries:
                groups.setdefault(d.queue, []).append(d.receipt)
        script = self.broker._scripts.ack
        # the records first: a message never counts as done while one is missing
        commands: list[_Command] = _results_commands(self.broker, results) if results else []
        commands += [
            self.broker._call(script, (self._target(q).inflight,), _ack_args(receipts))
            for q, receipts in groups.items()
        ]
        self.broker._pipeline(commands, f"acknowledging {len(deliveries)} deliveries")

    def retry(self, delivery: Delivery, message: Message) -> None:
        problem = _unstorable(message)
        if problem is None:
            try:
                raw = message.encode()
            except EncodeError as err:
                problem = str(err)
        if problem is not None:
            # Raising would fail this delivery the same way at every try, for ever.
            self.dead_letter(
                delivery,
                f"cannot store the next attempt: {problem}; this is the message as delivered",
            )
            return
        b = self.broker
        source = self._target(delivery.queue)
        batch, index = delivery.receipt >> BATCH_BITS, delivery.receipt & BATCH_MASK
        doing = f"scheduling a retry of a message of {delivery.queue!r}"
        if message.queue == delivery.queue:
            k = source.keys
            b._eval(
                b._scripts.retry,
                (*k.ready, k.delayed, source.inflight, k.wake, k.seq),
                (batch, index, message.priority, repr(float(message.eta)), raw),
                doing,
            )
            return
        # Another queue is another hash tag, so no one script can move the message: check that
        # this worker still holds it, store the new attempt, and settle the delivery only once
        # that succeeded (three round trips, on a rare path). A failure in between leaves the
        # message in both queues, to run twice, never in neither.
        if not b._eval(b._scripts.held, (source.inflight,), (batch, index), doing):
            return  # settled already, or recovered: the copy in the queue is the one that lives
        args: list[Any] = [0] * (MAX_PRIORITY + 1)
        if message.eta > time.time():
            args += [message.eta, _PRIORITY_ARG[message.priority], raw]
        else:
            args[message.priority] = 1
            args.append(raw)
        b._pipeline(
            [
                (("SADD", QUEUES, message.queue), None),
                b._call(b._scripts.publish, _publish_keys(message.queue), args),
            ],
            doing,
        )
        b._eval(b._scripts.ack, (source.inflight,), _ack_args([delivery.receipt]), doing)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        target = self._target(delivery.queue)
        k = target.keys
        receipt = delivery.receipt
        b = self.broker
        _, expired, dropped = b._eval(
            b._scripts.dead_letter,
            (target.inflight, k.dead, k.dead_raw, k.dead_reason),
            (
                receipt >> BATCH_BITS,
                receipt & BATCH_MASK,
                new_id(),
                reason,
                delivery.raw,
                repr(b.dead_letter_ttl),
                b.dead_letter_max,
            ),
            f"dead-lettering a message of {delivery.queue!r}",
        )
        log_trimmed(b, delivery.queue, expired, dropped)

    def defer(self, delivery: Delivery, eta: float) -> None:
        self.defer_many([(delivery, eta)])

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        """Each delivery goes back as it is (``retry.lua`` with its own bytes), one round trip."""
        if not items:
            return
        b = self.broker
        commands = []
        for delivery, eta in items:
            k = self._target(delivery.queue)
            batch, index = delivery.receipt >> BATCH_BITS, delivery.receipt & BATCH_MASK
            commands.append(
                b._call(
                    b._scripts.retry,
                    (*k.keys.ready, k.keys.delayed, k.inflight, k.keys.wake, k.keys.seq),
                    (batch, index, batch % 10, repr(float(eta)), delivery.raw),
                )
            )
        b._pipeline(commands, f"deferring {len(items)} deliveries")

    def _slot_commands(
        self, broker: RedisBroker, changes: Iterable[tuple[str, int, int]]
    ) -> list[_Command]:
        script = broker._scripts.slots
        return [
            broker._call(script, slot_keys(key), (self.worker_id, self._timeout_arg, limit, n))
            for key, limit, n in changes
        ]

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        if not requests:
            return []
        got = self.broker._pipeline(
            self._slot_commands(self.broker, requests),
            f"taking slots of {len(requests)} concurrency limits",
        )
        for (key, _, _), n in zip(requests, got, strict=True):
            if n:
                self._slots[key] = self._slots.get(key, 0) + int(n)
        return [int(n) for n in got]

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        if not releases:
            return
        self.broker._pipeline(
            self._slot_commands(self.broker, ((key, 0, -n) for key, n in releases)),
            f"giving back slots of {len(releases)} concurrency limits",
        )
        for key, n in releases:
            left = self._slots.get(key, 0) - n
            if left > 0:
                self._slots[key] = left
            else:
                self._slots.pop(key, None)

    def _touch_slots(self, broker: RedisBroker) -> None:
        """Move the deadline of the slots this consumer holds (with each heartbeat)."""
        held = list(self._slots)
        if held:
            broker._pipeline(
                self._slot_commands(broker, ((key, 0, 0) for key in held)),
                "refreshing concurrency slots",
            )

    def release_unique(self, locks: Sequence[tuple[str, str, str]]) -> None:
        if not locks:
            return
        by_queue: dict[str, list[str]] = {}
        for queue, key, message_id in locks:
            by_queue.setdefault(queue, []).extend((key, message_id))
        script = self.broker._scripts.unique_release
        commands = []
        for queue, args in by_queue.items():
            k = queue_keys(queue)
            commands.append(self.broker._call(script, (k.unique,), args))
        self.broker._pipeline(commands, f"releasing {len(locks)} unique locks")

    def release(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        by_queue: dict[str, list[Any]] = {}
        for d in deliveries:
            by_queue.setdefault(d.queue, []).extend(
                (d.receipt >> BATCH_BITS, d.receipt & BATCH_MASK, d.raw)
            )
        script = self.broker._scripts.release
        commands = []
        for queue, triples in by_queue.items():
            target = self._target(queue)
            k = target.keys
            commands.append(self.broker._call(script, (*k.ready, target.inflight, k.wake), triples))
        self.broker._pipeline(commands, f"releasing {len(deliveries)} deliveries")

    def heartbeat(self) -> bool:
        self._touch_slots(self.broker)
        return _beat_reporting(self, self.broker)

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        own = RedisBroker(
            self.broker._url,
            heartbeat_timeout=self.heartbeat_timeout,
            max_recoveries=self.broker.max_recoveries,
        )

        def beat() -> bool:
            self._touch_slots(own)
            return _beat_reporting(self, own)

        return beat, own.close

    def close(self) -> None:
        if self._pending is not None:  # what it took is in flight: the close script releases it
            with contextlib.suppress(redis.RedisError):
                self._collect()
        script = self.broker._scripts.close
        commands: list[_Command] = []
        for target in self._targets.values():
            k = target.keys
            commands.append(
                self.broker._call(
                    script, (*k.ready, target.inflight, k.workers, k.wake), (self.worker_id,)
                )
            )
            commands.append((("DEL", target.fetched), None))
        commands += self._slot_commands(
            self.broker, ((key, 0, -n) for key, n in self._slots.items())
        )
        self.broker._pipeline(commands, "closing a consumer")
        self._slots.clear()
