"""Rate and concurrency limits shared by every worker, taken per batch.

Before a fetched batch runs (``before_batch``), its jobs are counted per key; the slots of
concurrency limits, then the tokens of rate limits, are taken for the whole batch in one broker
call each. Jobs that get none are deferred: put back in their queue unchanged, due when a token
is (rate) or after a short pause (concurrency). A throttled message is not a failure: it spends
no attempt, never becomes a dead letter, and the jobs of other tasks and other keys in the batch
run as usual.

Tokens ahead. A rate limit without a key function that is far from binding (a safety cap) takes,
with a batch's tokens, a few more batches' worth (``RESERVE_BATCHES``), which this worker uses
for its next batches without a broker call, within ``RESERVE_HOLD`` seconds or never. Only when
they are a small share of what the limit gives in that time (``_spare``), so that a limit that
binds is shared between workers exactly as without them.

Slots. The solo pool runs a batch one job after another, so the jobs of one key in a batch share
one slot, given back when the last of them has an outcome (or when the batch ends, for those
handed back unrun). Pools that run jobs side by side take one slot per job, given back at its
outcome. Slots given back ride the acker's next flush. A worker that dies holding slots frees
them when its heartbeat deadline passes; one that stops gives them back when its session closes.

A key function that raises fails its job (dead letter, with the reason), without a retry.

Adaptive limits (``hurtle.adaptive``). A call that raises ``Throttle`` is noted here
(``throttled``, by the worker's failure path); before this worker next takes tokens, the keys
noted are cut in the broker, two calls for them all. A key known to be cut is read again at
most every ``REFRESH`` seconds, and its tokens are taken at the share of its limit the cut
leaves. A worker that never saw a key throttled reads nothing: it learns of a cut the first
time one of its own calls of that key is throttled.

Two classes, so that a task with only a plain rate limit keeps the processor's inline path:
``RateLimitMiddleware`` has batch hooks only; ``LimitsMiddleware`` adds the per-job hooks that
concurrency limits and key functions need.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from .._text import describe
from ..adaptive import Cut, cut, limit_at
from ..errors import Reject
from ..limits import Limits
from . import Job, Middleware, Outbox, Outcome, WorkerParts

if TYPE_CHECKING:
    from ..brokers import Broker
    from ..task import Task

log = logging.getLogger(__name__)

_TASK_NAME_OF = attrgetter("task.name")
#: A job throttled by a concurrency limit waits this long, give or take half, before it is
#: fetched again (nothing says when a slot will be free).
CONCURRENCY_PAUSE = 0.2


#: Seconds a worker keeps the rate-limit tokens it took ahead of its batches (``admit``); those
#: not used by then are dropped, never used later. A start is thus at most this late on the
#: token the limit counted for it: over any window, a limit lets through at most this many
#: seconds' worth of starts more than its tokens over the window (and its burst).
RESERVE_HOLD = 0.1
#: Batches' worth of tokens taken ahead, at most: one broker call serves this many and one more.
RESERVE_BATCHES = 4
_NO_RESERVE = (0, 0.0)
_monotonic = time.monotonic
#: Seconds a worker follows a cut key on what it last read, before it reads it again.
REFRESH = 1.0


def _spare(limit: int, period: float, wanted: int) -> int:
    """Tokens to take ahead with ``wanted`` for a limit of ``limit`` per ``period``: a few
    batches' worth, only when they are a small share of what the limit gives in
    ``RESERVE_HOLD`` (a limit far from binding, such as a safety cap); none for a limit that a
    batch or two could exhaust, where tokens held here would be missing elsewhere."""
    room = int(limit / period * RESERVE_HOLD)
    spare = RESERVE_BATCHES * wanted
    return spare if 2 * spare <= room else 0


class _Slot:
    """One concurrency slot held for ``left`` jobs of a batch."""

    __slots__ = ("key", "left")

    def __init__(self, key: str, left: int) -> None:
        self.key = key
        self.left = left


class RateLimitMiddleware(Middleware):
    """``rate_limit`` without a key function or a concurrency limit: batch hooks only."""

    def __init__(self) -> None:
        self._broker: Broker | None = None
        self._acker: Outbox | None = None
        self._consumer: Any = None
        self._shared = False  # the jobs of a batch run one after another (solo)
        self._lock = threading.Lock()
        # id of a running job's delivery -> (the delivery, kept alive so that its id stays its
        # own, the slot it holds)
        self._held: dict[int, tuple[Any, _Slot]] = {}
        self._bad: dict[int, str] = {}  # id of a delivery -> why its key could not be made
        #: task name -> (tokens taken ahead by ``admit``, monotonic time they expire)
        self._reserve: dict[str, tuple[int, float]] = {}
        #: rate key -> (its cut, ``time.monotonic()`` it was read), for keys known to be cut
        self._cuts: dict[str, tuple[Cut, float]] = {}
        #: rate key -> (wall time its last throttled call began, its configured limit)
        self._throttled: dict[str, tuple[float, int]] = {}

    def applies_to(self, task: Task[Any, Any]) -> bool:
        limits = task.limits
        return (
            limits is not None
            and limits.rate is not None
            and limits.concurrency is None
            and limits.rate_key is None
        )

    def worker_start(self, worker: WorkerParts) -> None:
        self._broker = worker.app.broker
        self._acker = worker.acker
        self._consumer = worker.consumer
        self._shared = worker.executor.runs_in_submit and worker.executor.concurrency == 1

    # -- before the batch --------------------------------------------------------------------

    def before_batch(self, jobs: list[Job]) -> None:
        self._take_tokens(jobs)  # every task here has a rate limit, and nothing else

    def admit(self, counts: dict[Task[Any, Any], int]) -> dict[str, tuple[int, float, float, str]]:
        # One key per task: the tokens of a batch need only how many calls each task has. A
        # limit far from binding (``_spare``) gives a few batches' worth at once: they are kept
        # here for ``RESERVE_HOLD`` seconds at most, and the batches they cover make no call.
        now = _monotonic()
        cuts = self._follow() if self._cuts or self._throttled else None
        requests: list[tuple[str, int, float, int, int, int]] = []
        with self._lock:
            reserve = self._reserve
            for task, n in counts.items():
                limits = task.limits
                assert limits is not None and limits.rate is not None
                limit, period = limits.rate
                if cuts is not None and task.name in cuts:
                    limit = limit_at(limit, cuts[task.name], time.time())
                held, until = reserve.pop(task.name, _NO_RESERVE)
                if until <= now:
                    held = 0  # too old to use: the limit counted them as started long ago
                elif held >= n:
                    reserve[task.name] = (held - n, until)
                    continue
                requests.append(
                    (task.name, limit, period, n - held, _spare(limit, period, n), held)
                )
        if not requests:
            return {}
        assert self._broker is not None, "worker_start first"
        granted = self._broker.take_tokens(
            [
                (name, limit, period, need + spare)
                for name, limit, period, need, spare, _ in requests
            ]
        )
        refused: dict[str, tuple[int, float, float, str]] = {}
        with self._lock:
            for (name, limit, period, need, _, held), (got, wait) in zip(
                requests, granted, strict=True
            ):
                if got > need:  # dated from before the call: they expire no later than due
                    self._reserve[name] = (got - need, now + RESERVE_HOLD)
                elif got < need:
                    refused[name] = (held + got, wait, period / limit, f"rate limit of {name!r}")
        return refused

    def _take_all(self, jobs: list[Job]) -> None:
        limited = [j for j in jobs if _limits(j).concurrency is not None]
        self._take_slots(limited)
        if limited:
            jobs = [j for j in jobs if not j.deferred]
        self._take_tokens([j for j in jobs if _limits(j).rate is not None])

    def _key(self, job: Job, make: Any, fn: Any) -> str | None:
        if fn is None:  # no key function: one key for the task
            return job.task.name
        try:
            return str(make(*job.arguments()))
        except Exception as err:
            self._bad[id(job.delivery)] = (
                f"its limit key could not be made from its arguments "
                f"({type(err).__name__}: {err}); fix the key function of task {job.task.name}"
            )
            return None

    def _take_slots(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        by_key: dict[str, tuple[int, list[Job]]] = {}
        for job in jobs:
            limits = _limits(job)
            key = self._key(job, limits.concurrency_key_of, limits.concurrency_key)
            if key is not None:
                assert limits.concurrency is not None
                by_key.setdefault(key, (limits.concurrency, []))[1].append(job)
        if not by_key:
            return
        requests = [
            (key, limit, 1 if self._shared else min(len(js), limit))
            for key, (limit, js) in by_key.items()
        ]
        assert self._consumer is not None, "worker_start first"
        granted = self._consumer.acquire_slots(requests)
        with self._lock:
            for (key, (_, js)), got in zip(by_key.items(), granted, strict=True):
                if self._shared and got:
                    slot = _Slot(key, len(js))
                    for job in js:
                        self._held[id(job.delivery)] = (job.delivery, slot)
                    continue
                for i, job in enumerate(js):
                    if i < got:
                        self._held[id(job.delivery)] = (job.delivery, _Slot(key, 1))
                    else:
                        job.defer(
                            CONCURRENCY_PAUSE * random.uniform(0.5, 1.5),
                            f"concurrency limit of {key!r}",
                        )

    def _take_tokens(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        by_key: dict[str, tuple[tuple[int, float], list[Job]]] = {}
        by_task: dict[str, list[Job]] = {}
        for name, run in groupby(jobs, _TASK_NAME_OF):  # a batch is mostly one run of a task
            group = by_task.get(name)
            if group is None:
                by_task[name] = list(run)
            else:
                group.extend(run)
        for name, js in by_task.items():
            limits = _limits(js[0])
            assert limits.rate is not None
            if limits.rate_key is None:  # one key for the task: no call per job
                by_key.setdefault(name, (limits.rate, []))[1].extend(js)
                continue
            for job in js:
                key = self._key(job, limits.rate_key_of, limits.rate_key)
                if key is not None:
                    by_key.setdefault(key, (limits.rate, []))[1].append(job)
        if not by_key:
            return
        if self._cuts or self._throttled:
            cuts = self._follow()
            wall = time.time()
            for key, ((limit, period), js) in by_key.items():
                if key in cuts:
                    by_key[key] = ((limit_at(limit, cuts[key], wall), period), js)
        assert self._broker is not None, "worker_start first"
        granted = self._broker.take_tokens(
            [(key, limit, period, len(js)) for key, ((limit, period), js) in by_key.items()]
        )
        for (key, ((limit, period), js)), (got, wait) in zip(by_key.items(), granted, strict=True):
            interval = period / limit
            for i, job in enumerate(js[got:]):  # spread out, in the order they came
                job.defer(wait + i * interval, f"rate limit of {key!r}")

    # -- adaptive limits ---------------------------------------------------------------------

    def throttled(self, job: Job, began: float) -> None:
        """A call of ``job`` that began at ``began`` (wall time) raised ``Throttle``: cut its
        key's rate before this worker next takes tokens (one cut per key and batch)."""
        limits = job.task.limits
        if limits is None or limits.rate is None or not self.applies_to(job.task):
            return
        key: str = job.task.name
        if limits.rate_key is not None:
            try:
                key = limits.rate_key_of(*job.arguments())
            except Exception:  # its next run fails on the key, with the reason
                return
        with self._lock:
            seen = self._throttled.get(key)
            if seen is None or began > seen[0]:
                self._throttled[key] = (began, limits.rate[0])

    def _follow(self) -> dict[str, Cut]:
        """Cut the keys throttled since the last call, read again those cut keys read more
        than ``REFRESH`` seconds ago (in one read and at most one write); the cuts in force."""
        now, wall = _monotonic(), time.time()
        with self._lock:
            throttled, self._throttled = self._throttled, {}
            stale = [
                k
                for k, (_, read) in self._cuts.items()
                if now - read >= REFRESH and k not in throttled
            ]
        if throttled or stale:
            assert self._broker is not None, "worker_start first"
            requests = [(k, began, limit) for k, (began, limit) in throttled.items()]
            try:
                found = cut(self._broker, requests, wall, stale)
            except Exception as err:  # the limits stand as they were: tokens are still taken
                log.warning(
                    "could not cut or read the adaptive rate limits of %s: %s; retrying with "
                    "the next batch",
                    ", ".join(map(repr, [*throttled, *stale])),
                    describe(err),
                )
                found = []
                with self._lock:
                    for k, v in throttled.items():
                        self._throttled.setdefault(k, v)
            with self._lock:
                for k, c in zip([*throttled, *stale], found, strict=False):
                    if c is None or c.whole_at() <= wall:
                        self._cuts.pop(k, None)
                    else:
                        self._cuts[k] = (c, now)
        with self._lock:
            return {k: c for k, (c, _) in self._cuts.items()}


class LimitsMiddleware(RateLimitMiddleware):
    """``concurrency_limit``, and rate limits with a key function (see ``hurtle.limits``)."""

    def applies_to(self, task: Task[Any, Any]) -> bool:
        limits = task.limits
        return limits is not None and (
            limits.concurrency is not None
            or (limits.rate is not None and limits.rate_key is not None)
        )

    def before_batch(self, jobs: list[Job]) -> None:
        self._take_all(jobs)

    admit = Middleware.admit  # keys and slots need each job: ``before_batch`` sees them all

    def worker_stop(self, worker: WorkerParts) -> None:
        with self._lock:
            held, self._held = self._held, {}
        self._give_back({id(slot): slot for _, slot in held.values()}.values())

    def before_process(self, job: Job) -> None:
        reason = self._bad.pop(id(job.delivery), None)
        if reason is not None:
            raise Reject(reason)

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        done = self._done(job)
        if done is not None:
            self._give_back([done])

    def after_batch(self, jobs: list[Job]) -> None:
        # jobs handed back unrun hold their share of a slot still: let it go
        slots: dict[int, _Slot] = {}
        with self._lock:
            for job in jobs:
                entry = self._held.pop(id(job.delivery), None)
                if entry is not None:
                    slots[id(entry[1])] = entry[1]
                self._bad.pop(id(job.delivery), None)
        self._give_back(s for s in slots.values() if s.left > 0)

    def _done(self, job: Job) -> _Slot | None:
        """Count a job out of its slot; the slot when no job of it is left."""
        with self._lock:
            entry = self._held.pop(id(job.delivery), None)
            if entry is None:
                return None
            slot = entry[1]
            slot.left -= 1
            return slot if slot.left == 0 else None

    def _give_back(self, slots: Any) -> None:
        acker = self._acker
        for slot in slots:
            slot.left = -1  # given back once
            if acker is not None:
                acker.release_slots(slot.key, 1)


def _limits(job: Job) -> Limits:
    limits = job.task.limits
    assert limits is not None
    return limits
