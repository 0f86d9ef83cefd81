"""The consumer of fair queues (``hurtle.fair``): one worker's session that reads each key's
sub-queue of the queues it reads in turn, beside the queues themselves.

A fair task's call of key ``k`` is stored in the sub-queue ``names.fair_queue(q, k)`` of its
queue ``q``. This consumer wraps ``main``, the worker's usual consumer of its queues, and:

* lists the sub-queues of its queues (``Broker.queues``) at most every ``REFRESH`` seconds,
  and the paused queues (``Broker.paused``): a paused queue's keys are not read either;
* fetches by turns: each fetch visits up to ``VISITS`` members (each live key, and ``main``
  for what was sent to the queues themselves), from where the last fetch stopped, asking each
  for ``weight`` shares of the batch (a key's weight is ``fair_weights``', else 1), then gives
  what is left of the batch to the members that filled their share; a member that had nothing
  is skipped until the next listing. So a key with 10 waiting calls is served in the next
  batch or two whatever the other keys hold;
* reads each key's sub-queue through a session of its own (``Broker.consumer`` on that
  sub-queue, under the worker's id and a suffix): everything is per message as on any queue
  (acknowledgements, retries back to the sub-queue, dead letters in it, recovery of a dead
  worker's deliveries, unique locks, results), and each delivery is settled by the session
  that fetched it. The heartbeat beats every session;
* hands a key's deliveries out as its session gave them (``Delivery.queue`` is the
  sub-queue: what the worker settles, unique locks included, goes there); the worker's counts
  sum a queue's keys as the queue's own (``reports.Tally.snapshot``);
* forgets a sub-queue found empty for ``FORGET_AFTER`` seconds (``Broker.forget``, which
  leaves one that holds anything) and closes its session once it holds nothing.

When nothing is ready it blocks on ``main`` for at most ``REFRESH`` seconds, then lists again:
an idle worker sees a new key's first call within about ``REFRESH`` seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from ..message import Message
from ..names import FAIR_MARK
from .consumer import Consumer, Settle, WrappingConsumer
from .records import Delivery, FlowStep, StoredResult
from .sharded import ShardedBroker

if TYPE_CHECKING:
    from .base import Broker

T = TypeVar("T")
_QUEUE = attrgetter("queue")

#: Seconds between two listings of the sub-queues (and longest block of an idle fetch).
REFRESH = 0.25
#: Most members (keys, and the queues themselves) one fetch asks.
VISITS = 16
#: Seconds a key's sub-queue is found empty before this consumer forgets it.
FORGET_AFTER = 60.0


class _Key:
    """One key's sub-queue as this consumer reads it."""

    __slots__ = ("empty_since", "held", "idle", "name", "queue", "session", "weight")

    def __init__(self, name: str, queue: str, weight: int) -> None:
        self.name = name
        self.queue = queue  # the fair queue it is a sub-queue of
        self.weight = weight
        self.session: Consumer | None = None
        self.held = 0  # deliveries handed out and not settled yet
        self.idle = False  # had nothing at its last visit since the last listing
        self.empty_since: float | None = None


class FairConsumer(WrappingConsumer):
    """``main`` (a consumer of ``queues``) reading ``queues``' fair sub-queues by turns;
    ``weights``: {sub-queue: shares of a batch} of the weighted keys."""

    def __init__(self, broker: Broker, main: Consumer, weights: Mapping[str, int]) -> None:
        super().__init__(main, main.queues)
        self.broker = broker
        #: Where the sub-queues are listed, read and forgotten: ``broker``, or the broker a
        #: sharded one stores its shards in (keys' sub-queues are not sharded, and it would
        #: name them as their queues).
        self._store = broker.inner if isinstance(broker, ShardedBroker) else broker
        #: ``inner``, one member of the turns: the consumer of the queues themselves.
        self.main = main
        self.weights = dict(weights)
        self._prefixes = {q + FAIR_MARK: q for q in main.queues}
        self._keys: dict[str, _Key] = {}
        self._main_idle = False
        self._turn = 0
        self._listed_at = -math.inf
        self._made = 0
        # sessions are made and closed on the fetching thread, beaten on the heartbeat's
        self._lock = threading.Lock()
        # ``held`` counts move on the fetching thread and on the threads that settle
        self._counting = threading.Lock()
        self._prefetched: _Key | None = None

    # -- the keys -------------------------------------------------------------------------

    def _list(self, now: float) -> None:
        """Find the live sub-queues; forget those empty long enough; drop those gone."""
        self._listed_at = now
        found: set[str] = set()
        for name in self._store.queues():
            mark = name.rfind(FAIR_MARK)
            queue = self._prefixes.get(name[: mark + len(FAIR_MARK)]) if mark > 0 else None
            if queue is None:
                continue
            found.add(name)
            if name not in self._keys:
                with self._lock:  # the heartbeat's thread goes through the keys
                    self._keys[name] = _Key(name, queue, self.weights.get(name, 1))
        paused = self._paused() if self._keys else set()
        for key in list(self._keys.values()):
            key.idle = key.queue in paused  # a paused queue's keys wait with it
            if key.held:
                continue
            gone = key.name not in found
            if not gone and key.empty_since is not None and now - key.empty_since > FORGET_AFTER:
                gone = self._forget(key.name)
            if gone:
                self._drop(key)
        self._main_idle = False

    def _forget(self, name: str) -> bool:
        """``Broker.forget``: False when the sub-queue holds anything (or cannot be forgotten)."""
        try:
            return self._store.forget(name)
        except NotImplementedError:
            return False

    def _paused(self) -> set[str]:
        try:
            return self._store.paused()
        except NotImplementedError:
            return set()

    def _drop(self, key: _Key) -> None:
        with self._lock:
            del self._keys[key.name]
            session, key.session = key.session, None
        if session is not None:
            session.close()

    def _session(self, key: _Key) -> Consumer:
        session = key.session
        if session is None:
            self._made += 1
            session = self._store.consumer((key.name,), f"{self.worker_id}~{self._made}")
            with self._lock:
                key.session = session
        return session

    # -- fetching -------------------------------------------------------------------------

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        if max_count <= 0:
            return []
        if self._prefetched is not None:
            out = self.take_prefetched()
            if out:
                return out
        deadline = time.monotonic() + timeout
        while True:
            out = self._round(max_count)
            if out:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            self._main_idle = False
            out = self.main.fetch(max_count, min(left, REFRESH))
            if out:
                self.cancellations = self.main.cancellations
                return out
            self._listed_at = -math.inf  # list again before the next round

    def _round(self, max_count: int) -> list[Delivery]:
        """One fetch by turns, without waiting: up to ``VISITS`` members from the turn on."""
        now = time.monotonic()
        if now - self._listed_at >= REFRESH:
            self._list(now)
        members: list[_Key | None] = [None, *self._keys.values()]  # None: ``main``
        n = len(members)
        start = self._turn % n
        visiting: list[_Key | None] = []
        for i in range(n):
            member = members[(start + i) % n]
            if not (self._main_idle if member is None else member.idle):
                visiting.append(member)
                if len(visiting) == VISITS:
                    self._turn = start + i + 1
                    break
        else:
            self._turn = start + 1
        out: list[Delivery] = []
        cancellations = False
        while visiting and len(out) < max_count:
            room = max_count - len(out)
            share = max(1, room // sum(1 if m is None else m.weight for m in visiting))
            more: list[_Key | None] = []
            for member in visiting:
                want = min(share * (1 if member is None else member.weight), room)
                got = self._take(member, want, now)
                if got:
                    out += got
                    room -= len(got)
                    session = self.main if member is None else member.session
                    cancellations = cancellations or bool(session and session.cancellations)
                if len(got) == want:
                    more.append(member)
                if room <= 0:
                    break
            visiting = more
        self.cancellations = cancellations
        return out

    def _take(self, member: _Key | None, want: int, now: float) -> list[Delivery]:
        """Up to ``want`` deliveries of one member, without waiting; marks it idle if none."""
        if member is None:
            got = self.main.fetch(want, 0)
            self._main_idle = not got
            return got
        got = self._session(member).fetch(want, 0)
        if not got:
            member.idle = True
            if member.empty_since is None:
                member.empty_since = now
            return got
        member.empty_since = None
        return self._outward(member, got)

    def _outward(self, key: _Key, got: list[Delivery]) -> list[Delivery]:
        """A key's deliveries, counted as held by its session."""
        with self._counting:
            key.held += len(got)
        return got

    def prefetch(self, max_count: int) -> None:
        """Prefetch from the one member with work, when only one has (one key: no turns) and
        no listing is due: the fetch after a listing's time lists, and sees a new key."""
        if self._prefetched is not None or not self._main_idle:
            return
        if time.monotonic() - self._listed_at >= REFRESH:
            return
        busy = [k for k in self._keys.values() if not k.idle]
        if len(busy) == 1 and busy[0].session is not None:
            busy[0].session.prefetch(max_count)
            self._prefetched = busy[0]

    def take_prefetched(self) -> list[Delivery]:
        key, self._prefetched = self._prefetched, None
        if key is None or key.session is None:
            return []
        got = key.session.take_prefetched()
        if got:
            self.cancellations = key.session.cancellations
        return self._outward(key, got) if got else got

    # -- settling -------------------------------------------------------------------------

    def _owner(self, delivery: Delivery) -> Consumer:
        """The session that fetched ``delivery`` (which settles it)."""
        key = self._keys.get(delivery.queue)
        if key is not None and key.session is not None:
            with self._counting:  # settled on the acker's thread
                key.held -= 1
            return key.session
        return self.main

    def _settle(
        self, deliveries: Sequence[Delivery], results: Sequence[StoredResult], last: Settle
    ) -> None:
        """Split per session: each delivery's result with it, results that ride with none to
        ``main``; ``last`` settles ``main``'s part."""
        keys = self._keys
        n = len(deliveries)
        queues = set(map(_QUEUE, deliveries)) if keys else ()
        if len(queues) <= 1 and len(results) <= n:  # the usual batch: of one key, or none
            key = keys.get(next(iter(queues))) if queues else None
            if key is None or key.session is None:
                last(self.main, deliveries, results)
                return
            with self._counting:
                key.held -= n
            key.session.ack(deliveries, results)
            last(self.main, (), ())
            return
        parts: dict[int, tuple[Consumer, list[Delivery], list[StoredResult]]] = {}
        for i, d in enumerate(deliveries):
            session = self._owner(d)
            part = parts.setdefault(id(session), (session, [], []))
            part[1].append(d)
            if i < len(results):
                part[2].append(results[i])
        for session, held, res in parts.values():
            if session is not self.main:
                session.ack(held, res)
        mine = parts.get(id(self.main), (self.main, [], []))
        if len(results) > n:  # records of attempts settled otherwise: ride with none
            if len(mine[2]) < len(mine[1]):
                self.main.ack([], results[n:])
            else:
                mine[2].extend(results[n:])
        last(self.main, mine[1], mine[2])

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        parts: dict[int, tuple[Consumer, list[FlowStep]]] = {}
        for step in steps:
            session = self._owner(step.delivery)
            parts.setdefault(id(session), (session, []))[1].append(step)
        for session, part in parts.values():
            session.ack_flow(part)

    def retry(self, delivery: Delivery, message: Message) -> None:
        self._owner(delivery).retry(delivery, message)

    def defer(self, delivery: Delivery, eta: float) -> None:
        self._owner(delivery).defer(delivery, eta)

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        self._each(items, lambda session, part: session.defer_many(part))

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._owner(delivery).dead_letter(delivery, reason)

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        self._each(items, lambda session, part: session.dead_letter_many(part))

    def release(self, deliveries: Sequence[Delivery]) -> None:
        self._each(
            [(d, None) for d in deliveries],
            lambda session, part: session.release([d for d, _ in part]),
        )

    def _each(
        self,
        items: Sequence[tuple[Delivery, T]],
        settle: Callable[[Consumer, list[tuple[Delivery, T]]], None],
    ) -> None:
        parts: dict[int, tuple[Consumer, list[tuple[Delivery, T]]]] = {}
        for delivery, value in items:
            session = self._owner(delivery)
            parts.setdefault(id(session), (session, []))[1].append((delivery, value))
        for session, part in parts.values():
            settle(session, part)

    # -- the session ----------------------------------------------------------------------

    def _sessions(self) -> list[Consumer]:
        with self._lock:
            return [k.session for k in self._keys.values() if k.session is not None]

    def heartbeat(self) -> bool:
        more = self.main.heartbeat()
        with self._lock:  # no session closes while it beats
            for key in self._keys.values():
                if key.session is not None:
                    more = key.session.heartbeat() or more
        return more

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        main_beat, main_end = self.main.heartbeat_session()
        beats: dict[int, tuple[Consumer, Callable[[], bool], Callable[[], None]]] = {}

        def beat() -> bool:
            more = main_beat()
            with self._lock:
                live = {id(s): s for k in self._keys.values() if (s := k.session) is not None}
                for gone in beats.keys() - live.keys():
                    beats.pop(gone)[2]()
                for ident, session in live.items():
                    if ident not in beats:
                        beats[ident] = (session, *session.heartbeat_session())
                    more = beats[ident][1]() or more
            return more

        def end() -> None:
            for _, _, stop in beats.values():
                stop()
            beats.clear()
            main_end()

        return beat, end

    def close(self) -> None:
        for session in self._sessions():
            session.close()
        with self._lock:
            self._keys.clear()
        self.main.close()


def consumer_of(
    broker: Broker, queues: Sequence[str], worker_id: str, weights: Mapping[str, int] | None
) -> Consumer:
    """``broker.consumer(queues, worker_id)``, reading the queues' fair keys by turns
    (``FairConsumer``, with ``weights``) unless ``weights`` is None (no task is fair)."""
    consumer = broker.consumer(queues, worker_id)
    return consumer if weights is None else FairConsumer(broker, consumer, weights)
