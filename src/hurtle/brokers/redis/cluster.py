"""``redis+cluster://host:port`` (and ``rediss+cluster://``): the Redis broker on a Redis Cluster.

Same scripts, same keys, same guarantees as ``RedisBroker``, through redis-py's cluster client
(``redis.cluster.RedisCluster``), which routes each command to the master serving its slot and
follows the cluster when slots move or a replica is promoted. Any node's address will do: the
client learns the others from it.

What makes that possible, and what differs from one server:

* Slots. Every key of a queue carries the hash tag ``{queue}`` (``keys.py``), so each script call
  touches one slot; every key a script touches is in its ``KEYS`` or derived from one of them
  by a suffix after the hash tag (``lua/_lib.lua``), which keeps the slot. Worker-wide keys
  (reports, deadlines, counters, the set of queues, results, limits) are written by plain
  commands or by scripts of their own slot, never from a queue's script. A pipeline goes out as
  one batch per master (redis-py's cluster pipeline), not as one round trip; a script in it
  goes by the slot of its first key, as a script sent alone does (redis-py 7 and later would
  otherwise ask a node for its keys with ``COMMAND GETKEYS``, sending every batch of messages
  to that node as well: ``_ScriptsByKey``).
* Waiting for messages. One ``BLPOP`` cannot wait on the wake lists of several queues (several
  slots). A consumer keeps one connection per queue, to the master serving that queue, sends a
  ``BLPOP`` on each, and waits on their sockets together (``select``): the first token that
  arrives, on any queue, wakes it, as on one server (no polling). A ``BLPOP`` that timed out
  is sent again at the next wait; when one pops a token, the others are cut (their connections
  closed), so that a busy consumer takes no token meant for an idle one, and are sent again on
  new connections at its next wait. The price: one connection per queue and idle consumer,
  and a reconnection per queue each time a consumer of several queues wakes from idle (none
  while messages keep coming: it only waits when nothing is ready).
* Results. A record's key has a slot of its own (its reader knows only the id), so a batch of
  records is written by plain commands in the ack's pipeline rather than in the ack's script,
  announced on a sharded channel (``SPUBLISH``/``SSUBSCRIBE``): the announcement goes to the
  one shard that serves ``hurtle:results``, not to every node as a plain ``PUBLISH`` would.
  Which of the worker's fetched batches are still held is read first (one ``HMGET`` per queue,
  a round trip more per batch of records), and only the records those batches delivered are
  written, before the acknowledgements: a worker taken for dead does not replace the records of
  the copies delivered again. What remains is the window between that read and the writes: a
  worker paused or cut off exactly there, past its heartbeat timeout, writes its records late
  (over those of the copies delivered again, if these were stored meanwhile).
* Failover. When a master dies, its replica takes over once the cluster declares it failed
  (``cluster-node-timeout``). Until then commands to its slots fail: the client retries a few
  times with backoff, then ``BrokerError`` is raised (a worker's fetch loop backs off and tries
  again, so consumption goes on after the promotion). Replication is asynchronous: a publish
  acknowledged by the master just before it died may not have reached the replica, and is then
  lost. ``?wait_replicas=N`` closes that window: each publish ends with ``WAIT N`` on the
  connection of every master it wrote to, and raises ``BrokerError`` unless N replicas of each
  acknowledged every write within ``?wait_timeout=`` seconds (default 1). What ran before the
  error stays stored (at least once, as for every publish that raised).
* Workflows: a step's keys span slots (the worker's queue, the next link's, the chord's), so
  ``ack_flow`` is a few per-slot round trips per batch instead of one atomic script per step:
  a worker that dies in the middle runs the step again, so a next link or a chord's callback
  may be published twice, never lost (``lua/chord_count.lua``). A message dead-lettered by
  recovery has its records (its own, its workflow's) stored by the heartbeat's caller, after
  the script (``heartbeat.lua`` hands them back); its unique lock, of its queue's slot, ends in
  the script.
* Databases: a cluster has only database 0.
"""

from __future__ import annotations

import contextlib
import selectors
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, SlotNotCoveredError
from redis.retry import Retry

import redis

from ...errors import BrokerError, ConfigurationError
from ...message import MAX_PRIORITY, Message
from ..columns import StoredResults
from ..common import LOST_TTL, check_steps
from ..keys import BATCH_BITS, BATCH_MASK, QUEUES, RESULT_BUCKET_CUT, RESULTS_CHANNEL, chord_key
from ..records import ChordStep, Delivery, FlowStep, StoredResult
from .broker import BLOCKING_SOCKET_TIMEOUT, RedisBroker, _check_replicas
from .consumer import MAX_BLOCK, RedisConsumer, _Target
from .results import _ResultListener, _results_commands
from .scripts import _Command, _publish_keys
from .settling import _part, _segments

SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: Retries of a command that failed on a connection, a timeout or a cluster in failover.
RETRIES = 6


class _Cluster(RedisCluster):
    """redis-py's cluster client, whose own errors (``RedisClusterException``: no node
    reachable, a slot no master serves, keys of several slots in one script) are
    ``redis.RedisError`` like every other failure, so that they become ``BrokerError``."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        parent: Any = super()
        try:
            return parent.execute_command(*args, **kwargs)
        except RedisClusterException as err:
            raise _unreachable(err) from err

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        parent: Any = super()
        pipe = parent.pipeline(transaction, shard_hint)
        if _SCRIPTS_BY_KEY is not None and hasattr(pipe, "_policy_resolver"):
            pipe._policy_resolver = _SCRIPTS_BY_KEY
        return _Pipeline(pipe)

    def get_node_from_key(self, key: Any, replica: bool = False) -> Any:
        parent: Any = super()
        try:
            return parent.get_node_from_key(key, replica)
        except RedisClusterException as err:
            raise _unreachable(err) from err


def _scripts_by_key() -> Any:
    """redis-py's own routing policies, with ``EVAL`` and ``EVALSHA`` routed by their keys
    (``numkeys`` and the keys after it), as its cluster client does for a command sent alone.
    Without this, its cluster pipeline (redis-py 7 and later) finds a script's keys with a
    ``COMMAND GETKEYS`` round trip to one node, carrying the script's every argument. ``None``
    with a redis-py without routing policies: its pipeline routes scripts by their keys."""
    try:
        from redis._parsers.commands import CommandPolicies, RequestPolicy, ResponsePolicy
        from redis.commands.policies import StaticPolicyResolver
    except ImportError:
        return None
    keyed = CommandPolicies(
        request_policy=RequestPolicy.DEFAULT_KEYED, response_policy=ResponsePolicy.DEFAULT_KEYED
    )

    class _ScriptsByKey(StaticPolicyResolver):
        def resolve(self, command_name: str) -> Any:
            if command_name in ("evalsha", "eval"):
                return keyed
            return super().resolve(command_name)

    return _ScriptsByKey()


_SCRIPTS_BY_KEY = _scripts_by_key()


class _Pipeline:
    """A cluster pipeline whose ``execute`` raises ``redis.RedisError`` rather than
    ``RedisClusterException``."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    def execute_command(self, *args: Any) -> None:
        self._pipe.execute_command(*args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return list(self._pipe.execute(raise_on_error=raise_on_error))
        except RedisClusterException as err:
            raise _unreachable(err) from err


def _unreachable(err: Exception) -> redis.RedisError:
    """redis-py's cluster error as the ``RedisError`` that says what happened: no node to talk
    to (unreachable, a slot no master serves) or a command the cluster cannot route."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, SlotNotCoveredError) or "cannot be connected" in str(err):
        return redis.ConnectionError(text)
    return redis.RedisError(text)


class RedisClusterConsumer(RedisConsumer):
    """A consumer whose fetches go to the master of each queue, and whose idle waits watch
    every queue's wake list at once (one connection per queue)."""

    def __init__(self, broker: RedisBroker, queues: tuple[str, ...], worker_id: str) -> None:
        super().__init__(broker, queues, worker_id)
        #: wake list -> a connection to the master serving it, with a BLPOP sent or not
        self._waiting: dict[str, Any] = {}
        self._sent: set[str] = set()

    def _pool_of(self, target: _Target) -> Any:
        node = self.broker._client.get_node_from_key(target.keys.wake)
        return self.broker._client.get_redis_connection(node).connection_pool

    def _wait_connection(self, key: str) -> Any:
        conn = self._waiting.get(key)
        if conn is None:
            pool = self._pool_of(self._targets_by_wake[key])
            kwargs = {**pool.connection_kwargs, "socket_timeout": BLOCKING_SOCKET_TIMEOUT}
            conn = self._waiting[key] = pool.connection_class(**kwargs)
        return conn

    @property
    def _targets_by_wake(self) -> dict[str, _Target]:
        return {t.keys.wake: t for t in self._reading}

    def _drop_waits(self) -> None:
        for conn in self._waiting.values():
            with contextlib.suppress(Exception):
                conn.disconnect()
        self._waiting.clear()
        self._sent.clear()

    def _block_then_take(self, seconds: float, max_count: int) -> tuple[list[Delivery], int] | None:
        # a queue's wake list and its fetch keys share a slot, but the wait is on connections
        # of the consumer's own, one per wake list: the fetch goes its usual way after it
        self._block(seconds)
        return None

    def _block(self, seconds: float) -> None:
        try:
            for key in self._wake_keys:
                if key not in self._sent:
                    self._wait_connection(key).send_command("BLPOP", key, MAX_BLOCK)
                    self._sent.add(key)
            # a reply read in part earlier, or whole in the parser's buffer
            ready = [k for k in self._wake_keys if self._waiting[k].can_read(0)]
            if not ready:
                with selectors.DefaultSelector() as sel:
                    for key in self._wake_keys:
                        sel.register(self._waiting[key]._sock, selectors.EVENT_READ, key)
                    ready = [k.data for k, _ in sel.select(seconds)]
            woke = False
            for key in ready:
                self._sent.discard(key)
                woke |= self._waiting[key].read_response() is not None  # None: timed out
            if woke:
                # Cut the other waits: left in place, they would pop tokens meant for idle
                # consumers while this one is busy. Sent again at the next wait.
                for key in list(self._sent):
                    self._sent.discard(key)
                    self._waiting.pop(key).disconnect()
        except (redis.RedisError, OSError) as err:
            # a node failed over, or a slot moved: new connections, to the masters the
            # cluster names now
            self._drop_waits()
            with contextlib.suppress(Exception):
                self.broker._client.nodes_manager.initialize()
            if isinstance(err, OSError):
                err = redis.ConnectionError(str(err))
            raise err from None

    def _ack_commands(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult]
    ) -> list[_Command]:
        """The records of the batches still held (read first: ``_held_only``), then the
        acknowledgements; a record's key is of another slot than the queue's, so no one script
        does both."""
        riding: Sequence[StoredResult]
        loose: list[StoredResult]
        if len(results) > len(deliveries):  # records past the deliveries ride with none
            every = list(results)
            riding, loose = every[: len(deliveries)], every[len(deliveries) :]
        else:
            riding, loose = results, []
        if riding:
            riding = self._held_only(deliveries[: len(riding)], riding)
        stored: Sequence[StoredResult] = [*riding, *loose] if loose and riding else loose or riding
        commands = _results_commands(self.broker, stored) if stored else []
        return commands + super()._ack_commands(deliveries, ())

    def _held_only(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult]
    ) -> Sequence[StoredResult]:
        """The records of ``results`` whose deliveries came in batches still held: one
        ``HMGET`` of the in-flight index per queue, in one pipeline."""
        segments = _segments(deliveries)
        batches: dict[str, list[int]] = {}
        for queue, batch, _, _ in segments:
            batches.setdefault(queue, []).append(batch)
        queues = list(batches)
        replies = self.broker._pipeline(
            [(("HMGET", self._target(q).inflight, *batches[q]), None) for q in queues],
            f"checking which of {len(deliveries)} deliveries are still held",
        )
        held = {
            (q, batch)
            for q, counts in zip(queues, replies, strict=True)
            for batch, count in zip(batches[q], counts, strict=True)
            if count is not None
        }
        kept = [(start, end) for q, batch, start, end in segments if (q, batch) in held]
        if len(kept) == len(segments):
            return results
        return StoredResults.join([_part(results, start, end) for start, end in kept] or [[]])

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        """Workflow steps in a few per-slot round trips for the whole batch, since one step's
        keys span slots: which deliveries are still held; then results, next links and chord
        counts; then the callbacks of completed chords; then their ``fired`` marks, forgotten
        chords and the acknowledgements. Not atomic like ``ack_flow.lua`` on one server: a
        worker that dies in between leaves its deliveries held, they come back, and their
        steps run again — a next link or a callback may be published twice, none is lost."""
        check_steps(steps)
        if not steps:
            return
        b = self.broker
        scripts = b._scripts
        doing = f"acknowledging {len(steps)} workflow steps"
        held = b._pipeline(
            [
                b._call(
                    scripts.held,
                    (self._target(step.delivery.queue).inflight,),
                    (step.delivery.receipt >> BATCH_BITS, step.delivery.receipt & BATCH_MASK),
                )
                for step in steps
            ],
            doing,
        )
        live = [step for step, h in zip(steps, held, strict=True) if h]
        if not live:
            return  # settled already, or recovered: the copy delivered again sets them off
        commands: list[_Command] = []
        queues: set[str] = set()
        counted: list[tuple[int, ChordStep]] = []  # (position of its chord_count, chord)
        results = [r for step in live for r in step.results]
        if results:
            commands += _results_commands(b, results)
        for step in live:
            for m in step.publish:
                queues.add(m.queue)
                commands.append(b._call(scripts.publish, _publish_keys(m.queue), _one(m)))
            chord = step.chord
            if chord is not None:
                counted.append((len(commands), chord))
                commands.append(
                    b._call(
                        scripts.chord_count,
                        (chord_key(chord.id),),
                        (chord.index, chord.total, chord.payload, max(int(chord.ttl * 1000), 1)),
                    )
                )
        if queues:
            commands.append((("SADD", QUEUES, *queues), None))
        replies = b._publishing(commands, doing) if commands else []
        complete = [chord for at, chord in counted if replies[at] == 1]
        if complete:
            commands = [(("SADD", QUEUES, *{c.callback.queue for c in complete}), None)]
            commands += [
                b._call(scripts.publish, _publish_keys(c.callback.queue), _one(c.callback))
                for c in complete
            ]
            b._publishing(commands, doing)
        commands = [(("HSET", chord_key(c.id), "fired", "1"), None) for c in complete]
        commands += [(("DEL", chord_key(step.forget)), None) for step in live if step.forget]
        if commands:
            b._pipeline(commands, doing)
        self.ack([step.delivery for step in live])

    def close(self) -> None:
        self._drop_waits()
        super().close()


class RedisClusterBroker(RedisBroker):
    """The broker contract on a Redis Cluster (7.0 or later: sharded pub/sub)."""

    _consumer_class = RedisClusterConsumer
    _sharded = True
    # a record's key has its own slot: heartbeat.lua hands the records back
    _heartbeat_flow_args = ("", int(LOST_TTL * 1000), RESULTS_CHANNEL, RESULT_BUCKET_CUT)

    def _connect(self, url: str, options: dict[str, Any]) -> None:
        parts = urlsplit(url)
        scheme = SCHEMES.get(parts.scheme.lower())
        if scheme is None:
            raise ConfigurationError(
                f"bad Redis Cluster URL {self.url!r}: expected redis+cluster://host:port or "
                "rediss+cluster://host:port (any node of the cluster)"
            )
        if parts.path.strip("/") not in ("", "0"):
            raise ConfigurationError(
                f"bad Redis Cluster URL {self.url!r}: a Redis Cluster has only database 0; "
                "leave the database out of the URL"
            )
        plain = parts._replace(scheme=scheme, path="").geturl()
        options = {
            **options,
            "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), RETRIES),
        }
        try:
            self._client = _Cluster.from_url(plain, **options)
            results: Any = _Cluster.from_url(plain, **options)
            self._results = results
        except (ValueError, TypeError) as err:
            raise ConfigurationError(
                f"bad Redis Cluster URL {self.url!r}: {err}; expected "
                "redis+cluster://[user:password@]host:port"
            ) from err
        except (redis.RedisError, RedisClusterException) as err:
            if not isinstance(err, redis.RedisError):
                err = _unreachable(err)
            self._fail(err, "learning the cluster's nodes")
        self._blocking = None  # consumers wait on connections of their own

        def refresh() -> None:
            results.nodes_manager.initialize()

        self._listener = _ResultListener(self._results, self.url, sharded=True, on_error=refresh)

    def _pipeline(self, commands: list[_Command], doing: str) -> list[Any]:
        try:
            return super()._pipeline(commands, doing)
        except BrokerError as err:
            if isinstance(err.__cause__, redis.ConnectionError | redis.TimeoutError):
                with contextlib.suppress(Exception):
                    self._client.nodes_manager.initialize()
            raise

    def _publishing(self, commands: list[_Command], doing: str) -> list[Any]:
        """With ``?wait_replicas=N``: the commands grouped by master, each group one pipeline on
        one connection ending with ``WAIT``, so that it covers exactly those writes."""
        if not self.wait_replicas:
            return self._pipeline(commands, doing)
        client = self._client
        wait = ("WAIT", self.wait_replicas, max(int(self.wait_timeout * 1000), 1))
        try:
            by_node: dict[str, tuple[Any, list[int]]] = {}
            for i, (cmd, _) in enumerate(commands):
                node = client.get_node_from_key(_first_key(cmd))
                by_node.setdefault(node.name, (node, []))[1].append(i)
            results: list[Any] = [None] * len(commands)
            for node, positions in by_node.values():
                pipe = client.get_redis_connection(node).pipeline(transaction=False)
                for i in positions:
                    pipe.execute_command(*commands[i][0])
                pipe.execute_command(*wait)
                replies = pipe.execute(raise_on_error=False)
                if any(isinstance(r, NoScriptError) for r in replies):
                    for _, script in commands:
                        if script is not None:
                            client.get_redis_connection(node).script_load(script.source)
                    pipe = client.get_redis_connection(node).pipeline(transaction=False)
                    for i in positions:
                        pipe.execute_command(*commands[i][0])
                    pipe.execute_command(*wait)
                    replies = pipe.execute(raise_on_error=False)
                for r in replies:
                    if isinstance(r, redis.RedisError):
                        raise r
                for i, r in zip(positions, replies, strict=False):
                    results[i] = r
                _check_replicas(replies[-1], self.wait_replicas, self.url, doing)
        except redis.RedisError as err:
            # MOVED (a slot moved) or a dead master: nothing of this group ran, or it ran
            # and is stored at least once; the next publish uses the cluster's new map
            with contextlib.suppress(Exception):
                client.nodes_manager.initialize()
            self._fail(err, doing)
        return results

    def close(self) -> None:
        self._listener.close()
        self._client.close()
        self._results.close()


def _one(m: Message) -> list[Any]:
    """``publish.lua``'s arguments for one message (its priority clamped as ack_flow.lua's)."""
    args: list[Any] = [0] * (MAX_PRIORITY + 1)
    priority = min(max(m.priority, 0), MAX_PRIORITY)
    if m.eta > time.time():
        args += [m.eta, str(priority), m.encode()]
    else:
        args[priority] = 1
        args.append(m.encode())
    return args


def _first_key(cmd: Sequence[Any]) -> Any:
    """The key a command of hurtle's is routed by: its first key."""
    if cmd[0] == "EVALSHA":
        return cmd[3]
    return cmd[1]
