"""``Scheduler``: enqueues an app's periodic tasks, from every worker at once, each tick once.

Every worker runs one (unless ``--no-scheduler``); none is a leader. At each tick, every scheduler
asks the broker to claim it (``Broker.claim_tick``): in one atomic step the broker records the
tick and publishes its message, only if no one claimed that tick yet (it keeps the schedule's
latest claimed ticks). One caller wins; the others, and anyone late with a tick claimed
already, publish nothing. So any number of workers on any number of hosts enqueue each tick
exactly once, and one that vanishes leaves the others to carry on.

Clocks. A tick is an instant (Unix seconds), and the broker judges each claim by its own clock
(``brokers.ticks``): a tick more than ``TICK_SKEW`` ahead of it is refused as early, and this
scheduler claims it again when the broker says it is due. So a host whose clock runs ahead
enqueues nothing before its time and shuts no one out; one whose clock runs behind only loses
claims to the others.

Missed ticks. On start, a scheduler reads each schedule's last tick from the broker: if a tick
came and went since then with no worker to claim it, the latest such tick is claimed now (once,
however many were missed), unless the schedule says ``catch_up=False``. A schedule that never ran
starts with its next tick; if the last tick cannot be read on start, it is read again until it
can, and only then are ticks claimed (a newer tick claimed first would shut out the missed one).
A scheduler that wakes late claims only the latest tick due. A claim the broker could not take
(unreachable, failing) is owed: tried again (after ``RETRY_FIRST`` seconds, doubled at each
failure up to ``RETRY_MOST``) until it is taken, and then every tick that came due meanwhile is
claimed in order (so are those that came due while a claim the broker took long to answer
was under way) — only the latest, as after a restart, if more than ``MAX_OWED`` came due or
the schedule says ``catch_up=False``.

Cost: one thread that sleeps until the next tick of any schedule (at most ``MAX_SLEEP``, so that
a change of the wall clock is noticed), and one broker round trip per tick per worker. The time
comes from a ``Clock``: the system's, unless a test hands the scheduler one of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import Hurtle
    from .brokers import TickClaim
    from .periodic import Schedule

log = logging.getLogger(__name__)

#: Longest sleep between two looks at the clock, in seconds.
MAX_SLEEP = 30.0
#: Seconds before a claim that failed is tried again; doubled at each failure up to the most.
RETRY_FIRST = 0.1
RETRY_MOST = 5.0
#: Most ticks of one schedule claimed in a row once the broker answers again after an outage;
#: when more came due, only the latest is claimed (with a warning).
MAX_OWED = 100
#: Shortest wait before a tick the broker judged early is claimed again, in seconds.
MIN_WAIT = 0.01


class Clock:
    """Where a scheduler reads the time and waits: the system's clock.

    A ``Scheduler`` takes another as ``clock=``: a subclass whose ``time`` is simulated and whose
    ``wait`` moves it on lets a test run days of schedules in a moment
    (``tests/test_schedule_time_travel.py``).
    """

    def time(self) -> float:
        """Now, in Unix seconds."""
        return time.time()

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Sleep ``seconds``, or until ``stop`` is set; True if it was set."""
        return stop.wait(seconds)


@dataclasses.dataclass
class _Plan:
    """Where one schedule stands in this scheduler."""

    next: float  # the next tick to claim
    owed: bool = False  # a claim of ``next`` failed or was early: claim it (and those after)
    retry_at: float = 0.0  # when to claim the owed ticks (this scheduler's clock)
    failures: int = 0  # claims that failed in a row
    start_due: float | None = None  # due on start, its last tick unread: catch-up undecided


class Scheduler:
    """Claims the ticks of ``schedules`` (default: every schedule of ``app``) on a thread."""

    def __init__(
        self,
        app: Hurtle,
        schedules: Sequence[Schedule] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.schedules = list(app.schedules.values() if schedules is None else schedules)
        self.clock = Clock() if clock is None else clock
        self._plans: dict[str, _Plan] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Ticks this scheduler won, and claims it asked the broker for (tests and logs).
        self.claimed = 0
        self.tried = 0

    def start(self) -> None:
        """Catch up on missed ticks (before returning), then claim ticks on a daemon thread."""
        if not self.schedules:
            return
        self.begin(self.clock.time())
        log.info(
            "scheduler: %s",
            "; ".join(
                f"{s.name} ({s.describe()}) next at {_when(self._plans[s.name].next)}"
                for s in self.schedules
            ),
        )
        self._thread = threading.Thread(target=self._run, name="hurtle-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Claim nothing more; wait up to ``timeout`` for a claim under way."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def begin(self, now: float) -> float:
        """Claim the latest missed tick of each schedule that catches up; plan the next ones.
        Returns when ``run_due`` has something to do next."""
        for s in self.schedules:
            plan = self._plans[s.name] = _Plan(next=s.next_after(now))
            due = s.last_at(now)
            if not s.catch_up or due is None:
                continue
            try:
                last = self.app.broker.last_tick(s.queue, s.name)
            except Exception as err:
                # owed: until this is known, a newer tick claimed here could shut out the
                # missed one, which the other schedulers may still be trying to claim
                log.warning(
                    "schedule %s: cannot read its last tick (%s): trying again", s.name, err
                )
                plan.start_due = due
                self._failed(plan, now)
                continue
            self._catch_up(s, plan, due, last)
            if plan.next <= now:
                self._claim_due(s, plan, now)
        return self._wake()

    def run_due(self, now: float) -> float:
        """Claim the due ticks of each schedule: the latest one whose time has come, and those
        still owed. Returns when there is something to do next: always after ``now``."""
        for s in self.schedules:
            plan = self._plans[s.name]
            if plan.owed:
                if plan.retry_at <= now:
                    self._claim_due(s, plan, now)
            elif plan.next <= now:
                latest = s.last_at(now)  # a scheduler that wakes late claims only this one
                if latest is not None and latest > plan.next:
                    plan.next = latest
                self._claim_due(s, plan, now)
        return self._wake()

    def claim(self, schedule: Schedule, tick: float) -> TickClaim | None:
        """Ask the broker for ``tick`` of ``schedule``: its answer, or None if it gave none."""
        self.tried += 1
        try:
            answer = self.app.broker.claim_tick(
                schedule.queue, schedule.name, tick, [schedule.message(tick)], schedule.unique_for
            )
        except Exception as err:  # owed: tried again until the broker takes it
            plan = self._plans.get(schedule.name)
            if plan is None or not plan.failures:
                log.warning(
                    "schedule %s: could not claim tick %s (%s): trying again",
                    schedule.name,
                    _when(tick),
                    err,
                )
            return None
        if answer.won:
            self.claimed += 1
            if answer.held_by is None:
                log.info("schedule %s: enqueued tick %s", schedule.name, _when(tick))
            else:
                log.info(
                    "schedule %s: tick %s enqueued nothing: message %s, a call like it, holds "
                    "the task's unique lock",
                    schedule.name,
                    _when(tick),
                    answer.held_by,
                )
        elif answer.early:
            log.info(
                "schedule %s: tick %s is %.3fs ahead of the broker's clock: claiming it then",
                schedule.name,
                _when(tick),
                answer.early,
            )
        return answer

    def _catch_up(self, s: Schedule, plan: _Plan, due: float, last: float | None) -> None:
        """Plan from ``due`` (the tick due when this scheduler began) if it was missed."""
        if last is not None and last < due:
            log.info(
                "schedule %s: tick %s was missed (last run %s): running it now",
                s.name,
                _when(due),
                _when(last),
            )
            plan.next = due
        else:
            plan.next = s.next_after(due)

    def _failed(self, plan: _Plan, now: float) -> None:
        plan.owed = True
        plan.failures += 1
        plan.retry_at = now + min(RETRY_FIRST * 2 ** (plan.failures - 1), RETRY_MOST)

    def _claim_due(self, s: Schedule, plan: _Plan, now: float) -> None:
        """Claim ``plan.next`` and each tick after it up to ``now``, in order; stop at the first
        claim the broker could not take, or judged early, and owe it."""
        if plan.start_due is not None:  # the catch-up on start is still to be decided
            try:
                last = self.app.broker.last_tick(s.queue, s.name)
            except Exception:
                self._failed(plan, now)
                return
            self._catch_up(s, plan, plan.start_due, last)
            plan.start_due = None
        if plan.owed and plan.next <= now:
            self._give_up_old(s, plan, now)
        while plan.next <= now:
            asked = self.clock.time()
            answer = self.claim(s, plan.next)
            if answer is None:
                self._failed(plan, now)
                return
            if answer.early:
                plan.owed = True
                plan.retry_at = now + max(answer.early, MIN_WAIT)
                return
            if plan.failures:
                log.info("schedule %s: the broker answers again", s.name)
                plan.failures = 0
            plan.next = s.next_after(plan.next)
            # the ticks that came due while the broker took this claim (seconds, when its
            # server went away and came back under it) are owed, as after a claim that
            # failed: not skipped, as by a scheduler that wakes late
            now += self.clock.time() - asked
        plan.owed = False

    def _give_up_old(self, s: Schedule, plan: _Plan, now: float) -> None:
        """Of the ticks owed since an outage, claim only the latest if there are more than
        ``MAX_OWED`` or the schedule says ``catch_up=False``."""
        latest = s.last_at(now)
        if latest is None or latest <= plan.next:
            return
        if not s.catch_up:
            plan.next = latest
            return
        if not plan.failures:
            return  # owed because early: the broker's clock sets the pace, tick by tick
        tick, count = plan.next, 0
        while tick <= now and count <= MAX_OWED:
            tick, count = s.next_after(tick), count + 1
        if count > MAX_OWED:
            log.warning(
                "schedule %s: more than %d ticks came due while the broker was unreachable: "
                "giving up those from %s, claiming from %s",
                s.name,
                MAX_OWED,
                _when(plan.next),
                _when(latest),
            )
            plan.next = latest

    def _wake(self) -> float:
        if not self._plans:
            return float("inf")
        return min(p.retry_at if p.owed else p.next for p in self._plans.values())

    def _run(self) -> None:
        clock = self.clock
        while not self._stop.is_set():
            try:
                wake = self.run_due(clock.time())
            except Exception:  # never let the schedules stop for good
                log.exception("scheduler: unexpected failure; carrying on")
                wake = clock.time() + RETRY_MOST
            wait = wake - clock.time()
            if wait > 0 and clock.wait(min(wait, MAX_SLEEP), self._stop):
                return


def _when(t: float) -> str:
    """A tick as local time with milliseconds, for logs."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
