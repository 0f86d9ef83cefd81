"""``RedisConsumer``: one worker's session — what it takes (fetch, prefetch) and its heartbeat;
how it settles what it took is ``settling.py``'s, its limits ``limits.py``'s."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

import redis

from ...errors import BrokerError
from ...ids import new_id
from ..consumer import BatchConsumer, fetch_wait
from ..keys import BATCH_BITS, BATCH_MASK, QueueKeys, queue_keys
from ..records import Delivery, Lock, Ride, StoredResult
from .limits import _Limits
from .scripts import RAW, _Command, _pack
from .settling import _Settling
from .workers import _beat_reporting, leave_commands, report_commands

if TYPE_CHECKING:
    from .broker import RedisBroker

#: Longest single ``BLPOP``; a longer ``fetch`` timeout blocks in several steps of this.
MAX_BLOCK = 5.0
_NO_RIDE = Ride([])
#: Due delayed messages promoted per fetch, at least (more when the batch is larger).
PROMOTE_LIMIT = 1000


class _Target:
    """One queue of a consumer, with its script keys built once."""

    __slots__ = ("fetch_keys", "fetched", "inflight", "keys", "name", "singleton", "token")

    def __init__(self, name: str, worker_id: str, probes: bool = False) -> None:
        self.name = name
        #: ``{name}``: a consumer's ``unreplaced`` after a fetch of this queue alone said so.
        self.singleton = frozenset((name,))
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
            k.paused,
            k.cancels,
            k.replaced,
            # one queue holds one probe ready at most: only a fetch over several looks for them
            *((k.probe,) if probes else ()),
        )
        #: The token of the next fetch from this queue: a new one once a reply has been read.
        self.token = new_id()


class RedisConsumer(_Settling, _Limits, BatchConsumer):
    """One worker's session: what it holds is under ``hurtle:{queue}:inflight:<worker_id>``."""

    def __init__(self, broker: RedisBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        #: This worker's own timeout: its deadline, as other workers see it, is a beat plus this.
        self.heartbeat_timeout = broker.heartbeat_timeout
        self._timeout_arg = repr(float(broker.heartbeat_timeout))
        reading = dict.fromkeys(queues)
        self._targets = {name: _Target(name, worker_id, len(reading) > 1) for name in reading}
        self._reading = list(self._targets.values())
        self._wake_keys = [t.keys.wake for t in self._reading]
        self._fetch = broker._scripts.fetch
        # a fetch script sent by ``prefetch`` whose reply is still to be read: (connection,
        # its pool, want, the ride sent before it, how many replies it has)
        self._pending: tuple[Any, Any, int, Ride, int] | None = None
        # the last fetch waited on an empty queue and woke to fewer than it asked for: the
        # queue ran dry with them, and ``prefetch`` leaves the next fetch until after they run
        self._woke_dry = False
        # the scripts of rides the server knows (each loaded before the first ride that calls
        # it, and again after a server forgot them: a failed ride costs a second trip)
        self._known: set[str] = set()
        # the connection prefetches are sent on, kept between them: (connection, its pool)
        self._kept: tuple[Any, Any] | None = None
        #: concurrency key -> slots this consumer holds (their deadlines move with each beat)
        self._slots: dict[str, int] = {}

    def _target(self, queue: str) -> _Target:
        target = self._targets.get(queue)
        if target is None:  # a delivery from a queue this consumer does not read: still settle it
            target = self._targets[queue] = _Target(queue, self.worker_id)
        return target

    @property
    def acks_ride_prefetch(self) -> bool:  # type: ignore[override]
        return len(self._reading) == 1 and self.broker._raw_ok and _pack is not None

    def prefetch(self, max_count: int) -> None:
        self.prefetch_with_acks(max_count, _NO_RIDE)

    def prefetch_with_acks(self, max_count: int, ride: Ride) -> bool:
        """The fetch script sent now and its reply read by the next ``fetch``; with a
        ``ride``, the calls of its acknowledgements (records with them, unique locks after
        them: what the acker's flush sends) go first in the same send, and their replies are
        read with the fetch's (``_collect``): the solo loop's outcomes cost no round trip and
        no other thread's work."""
        if self._pending is not None or len(self._reading) != 1 or max_count <= 0:
            return False  # several queues are read in turn: nothing to overlap
        if self._woke_dry:
            # A worker woken from an idle wait to a batch smaller than it asked for (one send
            # to an idle worker): the queue is empty again, so a prefetch now would most likely
            # come back empty, its command and script in the way of the task that just arrived.
            # The next fetch asks after the batch has run. Batches taken from a backlog (full,
            # or without a wait) are prefetched as before: their sizes, and so how their
            # results are stored, do not change.
            return False
        max_count = min(max_count, BATCH_MASK)
        fetch = self._fetch_command(self._reading[0], max_count)
        packed: list[bytes] = []
        if ride.deliveries or ride.locks:
            if not self.acks_ride_prefetch:
                return False
            assert _pack is not None
            pack = _pack
            commands = self._ack_commands(ride.deliveries, ride.results)
            commands += self._unique_commands(ride.locks)
            for _, script in commands:
                if script is not None and script.sha not in self._known:
                    with contextlib.suppress(redis.RedisError):
                        self.broker._client.script_load(script.source)
                        self._known.add(script.sha)
            packed = [c[1] if c[0] is RAW else pack(c) for c, _ in commands]
        pool = self._pool_of(self._reading[0])
        # Whatever fails here, the next fetch meets the problem and reports it; if the command
        # did reach the server, that fetch carries the same token and hands the batch back.
        # The connection is kept from one prefetch to the next (taken from the pool and given
        # back at each batch cost more than the send).
        kept = self._kept
        if kept is not None and kept[1] is pool:
            conn = kept[0]
        else:
            self._drop_kept()
            try:
                conn = pool.get_connection()
            except (redis.RedisError, OSError):
                return False
            self._kept = (conn, pool)
        try:
            if packed:
                packed.append(_pack(fetch))  # type: ignore[misc]
                conn.send_packed_command([b"".join(packed)])
            else:
                conn.send_command(*fetch)
        except (redis.RedisError, OSError):
            self._drop_kept()
            if packed:  # perhaps recorded, perhaps not: recorded again, counted once
                self._unsettled(ride)
            return True
        self._pending = (conn, pool, max_count, ride, len(packed) - 1 if packed else 0)
        return True

    def _settle_riding(self, ride: Ride, recorded: bool, forgotten: bool) -> None:
        """After the replies of acknowledgements that rode a prefetch: those not recorded go
        back to the acker; a server that did not know the script (restarted) is sent it before
        the next ones ride."""
        if recorded:
            return
        self._unsettled(ride)
        if forgotten:
            self._known.clear()

    def _drop_kept(self, broken: bool = True) -> None:
        """Give the prefetch's kept connection back to its pool, disconnected when
        ``broken`` (a reply half read, a failed send: it cannot be reused)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            if broken:
                kept[0].disconnect()
            kept[1].release(kept[0])

    def _unsettled(self, ride: Ride) -> None:
        if self.unsettled_acks is not None:
            self.unsettled_acks(ride)

    def _pool_of(self, target: _Target) -> Any:
        """The connection pool of the server that holds ``target``'s keys."""
        return self.broker._client.connection_pool

    def _block(self, seconds: float) -> None:
        """Wait until a publish pushes a token to one of the wake lists, or ``seconds`` pass."""
        self.broker._blocking.execute_command("BLPOP", *self._wake_keys, seconds)

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
        conn, _, want, ride, replies = self._pending
        self._pending = None
        recorded = True
        forgotten = False
        try:
            for _ in range(replies):  # the riding acknowledgements' first
                try:
                    conn.read_response()
                except redis.ResponseError as err:  # refused: the acker's to settle
                    recorded = False
                    if isinstance(err, NoScriptError):  # a new server: the next ones ride
                        forgotten = True
            res = conn.read_response()
        except NoScriptError:
            self._settle_riding(ride, recorded, forgotten)
            return self._take(want)[0]
        except BaseException:
            self._drop_kept()  # a reply half read: the connection cannot be reused
            if replies:
                self._unsettled(ride)
            raise
        self._settle_riding(ride, recorded, forgotten)
        target = self._reading[0]
        target.token = new_id()
        self._flags(target, res[1])
        return self._deliveries(target.name, res)

    def _flags(self, target: _Target, flags: int) -> None:
        """What the fetch script of one queue said besides the batch: whether cancellations
        may be live, whether a debounced call may have been replaced (``unreplaced``)."""
        self.cancellations = bool(flags & 1)
        self.unreplaced = frozenset() if flags & 2 else target.singleton

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        self._woke_dry = False
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
        taken: tuple[list[Delivery], int] | None = None
        waited = False
        while True:
            out, wait_ms = self._take(max_count) if taken is None else taken
            if out:
                self._woke_dry = waited and len(out) < max_count
                return out
            block = fetch_wait(deadline, MAX_BLOCK, wait_ms / 1000 if wait_ms >= 0 else None)
            if block is None:
                return out
            # BLPOP takes seconds with millisecond resolution, and 0 would mean forever.
            block = max(math.ceil(block * 1000), 1) / 1000
            waited = True
            try:
                taken = self._block_then_take(block, max_count)
            except redis.RedisError as err:
                self.broker._fail(err, f"waiting for messages on {list(self.queues)}")

    def _block_then_take(self, seconds: float, max_count: int) -> tuple[list[Delivery], int] | None:
        """``_block``, and in the same round trip the fetch that follows it: a server runs a
        client's commands in order, so the fetch script runs the moment the wait ends, and a
        message sent to an idle worker reaches it in one round trip instead of two (a wake-up,
        then a fetch). For a consumer of one queue (of several, each script would ask for the
        whole batch); None when the caller fetches itself: several queues, or a server that
        forgot the script. A reply lost on the way leaves the target's token as it was: the
        next fetch carries it and is handed the same batch."""
        if len(self._reading) != 1:
            self._block(seconds)
            return None
        target = self._reading[0]
        wait = ("BLPOP", *self._wake_keys, seconds)
        fetch = self._fetch_command(target, max_count)
        broker = self.broker
        if broker._raw_ok and _pack is not None:
            # packed by hiredis and read raw, as the acknowledgements are: what redis-py's
            # pipeline does around a reply comes between the wake-up and the task
            woke, res = broker._send_packed(
                [_pack(wait), _pack(fetch)],
                f"waiting for messages on {list(self.queues)}",
                retry=True,
                pool=broker._blocking.connection_pool,
            )
        else:
            pipe = broker._blocking.pipeline(transaction=False)
            pipe.execute_command(*wait)
            pipe.execute_command(*fetch)
            woke, res = pipe.execute(raise_on_error=False)
        for reply in (woke, res):
            if isinstance(reply, NoScriptError):
                return None
            if isinstance(reply, Exception):
                raise reply
        target.token = new_id()
        if len(res) > 2:
            self._flags(target, res[1])
            return self._deliveries(target.name, res), -1
        return [], res[0] if res[0] >= 0 else -1

    def _take(self, max_count: int) -> tuple[list[Delivery], int]:
        """Run the fetch script on each queue in order until ``max_count`` are taken."""
        out: list[Delivery] = []
        wait_ms = -1
        cancellations = False
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
                    self.cancellations = True  # not known for them all: the worker asks
                    return out, 0
                raise
            target.token = new_id()
            if len(self._reading) == 1:  # of several queues, each fetch says for its own
                self.unreplaced = frozenset() if res[1] & 2 else target.singleton
            if len(res) > 2:
                cancellations = cancellations or bool(res[1] & 1)
                out += self._deliveries(target.name, res)
                if len(out) >= max_count or res[0] == 1:
                    break  # full, or it holds a message let out of quarantine: alone of those
            elif res[0] >= 0 and (wait_ms < 0 or res[0] < wait_ms):
                wait_ms = res[0]
        if out:
            self.cancellations = cancellations
        return out, wait_ms

    @staticmethod
    def _deliveries(name: str, res: list[Any]) -> list[Delivery]:
        """Deliveries from a fetch script's reply (after its wait and cancels flag): one batch
        per priority, id then payloads."""
        out: list[Delivery] = []
        for at in range(2, len(res), 2):
            base = res[at] << BATCH_BITS
            raws = res[at + 1]
            n = len(raws)
            out += map(Delivery, repeat(name, n), raws, range(base, base + n))
        return out

    def ack_and_release(
        self,
        deliveries: Sequence[Delivery],
        results: Sequence[StoredResult],
        locks: Sequence[Lock],
    ) -> None:
        # one round trip: the records, the acknowledgements, then the locks they held
        commands = self._ack_commands(deliveries, results) + self._unique_commands(locks)
        if commands:
            self.broker._pipeline_raw(
                commands,
                f"acknowledging {len(deliveries)} deliveries and releasing their unique locks",
            )

    def heartbeat(self) -> bool:
        self._touch_slots(self.broker)
        return _beat_reporting(self, self.broker)

    def send_report(self) -> None:
        with self._reporting() as report:
            if report is not None:
                self.broker._pipeline(
                    report_commands(report, self.heartbeat_timeout), "storing a worker's report"
                )

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        own = type(self.broker)(
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
        self._drop_kept(broken=False)
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
        with self._reporting() as report:
            if report is not None:  # leaves with its last counts in the totals
                commands += leave_commands(report)
            self.broker._pipeline(commands, "closing a consumer")
            self._slots.clear()
