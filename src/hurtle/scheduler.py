"""``Scheduler``: enqueues an app's periodic tasks, from every worker at once, each tick once.

Every worker runs one (unless ``--no-scheduler``); none is a leader. At each tick, every scheduler
asks the broker to claim it (``Broker.claim_tick``): in one atomic step the broker records the
tick as the schedule's last and publishes its message, only if the last recorded tick is older.
One caller wins; the others, and anyone late with an older tick, publish nothing. So any number
of workers on any number of hosts enqueue each tick exactly once, and one that vanishes leaves
the others to carry on. Clocks need not agree: a host that runs behind only loses claims.

Missed ticks. On start, a scheduler reads each schedule's last tick from the broker: if a tick
came and went since then with no worker to claim it, the latest such tick is claimed now (once,
however many were missed), unless the schedule says ``catch_up=False``. A schedule that never ran
starts with its next tick. A scheduler that wakes late claims only the latest tick due.

Cost: one thread that sleeps until the next tick of any schedule (at most ``MAX_SLEEP``, so that
a change of the wall clock is noticed), and one broker round trip per tick per worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import Hurtle
    from .periodic import Schedule

log = logging.getLogger(__name__)

#: Longest sleep between two looks at the clock, in seconds.
MAX_SLEEP = 30.0


class Scheduler:
    """Claims the ticks of ``schedules`` (default: every schedule of ``app``) on a thread."""

    def __init__(self, app: Hurtle, schedules: Sequence[Schedule] | None = None) -> None:
        self.app = app
        self.schedules = list(app.schedules.values() if schedules is None else schedules)
        self._next: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Ticks this scheduler won (tests and logs).
        self.claimed = 0

    def start(self) -> None:
        """Catch up on missed ticks (before returning), then claim ticks on a daemon thread."""
        if not self.schedules:
            return
        self.begin(time.time())
        log.info(
            "scheduler: %s",
            "; ".join(
                f"{s.name} ({s.describe()}) next at {_when(self._next[s.name])}"
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

    def begin(self, now: float) -> None:
        """Claim the latest missed tick of each schedule that catches up; plan the next ones."""
        for s in self.schedules:
            due = s.last_at(now)
            if s.catch_up and due is not None:
                try:
                    last = self.app.broker.last_tick(s.queue, s.name)
                except Exception as err:
                    log.warning(
                        "schedule %s: cannot read its last tick (%s): not catching up", s.name, err
                    )
                    last = None
                if last is not None and last < due:
                    log.info(
                        "schedule %s: tick %s was missed (last run %s): running it now",
                        s.name,
                        _when(due),
                        _when(last),
                    )
                    self.claim(s, due)
            self._next[s.name] = s.next_after(now)

    def run_due(self, now: float) -> None:
        """Claim the latest due tick of each schedule whose next tick has come."""
        for s in self.schedules:
            if self._next[s.name] <= now:
                tick = s.last_at(now)
                if tick is not None:
                    self.claim(s, tick)
                self._next[s.name] = s.next_after(now)

    def claim(self, schedule: Schedule, tick: float) -> bool:
        """Try to enqueue ``tick`` of ``schedule``; True if this scheduler won it."""
        try:
            won = self.app.broker.claim_tick(
                schedule.queue, schedule.name, tick, [schedule.message(tick)]
            )
        except Exception as err:  # another worker may claim it; this one carries on
            log.warning("schedule %s: could not claim tick %s: %s", schedule.name, _when(tick), err)
            return False
        if won:
            self.claimed += 1
            log.info("schedule %s: enqueued tick %s", schedule.name, _when(tick))
        return won

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = min(self._next.values()) - time.time()
            if wait > 0:
                if self._stop.wait(min(wait, MAX_SLEEP)):
                    return
                continue
            self.run_due(time.time())


def _when(t: float) -> str:
    """A tick as local time with milliseconds, for logs."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
