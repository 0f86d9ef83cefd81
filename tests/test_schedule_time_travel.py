"""Time travel: a scheduler runs days of cron schedules across both DST changes of several zones
in a moment, on a simulated clock (``Scheduler(clock=...)``), through its own loop and thread.

Workers restart now and then (a new scheduler on the same broker), at random and in and around
the hour that changes. Each schedule's ticks are compared with a list made here independently
of cronsim, by scanning the minutes of the window: every instant is claimed once, none is
missed, and the loop makes a bounded number of claims and wake-ups per simulated hour (it never
spins).

The expected ticks follow Debian cron's rules (README, Periodic tasks): an expression with ``*``
in its minute or hour field matches wall-clock times as they pass (both passes of a repeated
hour, none of a skipped one); a fixed time runs once per day, at the first instant at which the
wall clock reads that time or later (so at the end of a skipped hour, and on the first pass of
a repeated one).
"""

from __future__ import annotations

import collections
import itertools
import random
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from hurtle import Hurtle, Message
from hurtle.scheduler import MAX_SLEEP, Clock, Scheduler

#: (zone, a day of a DST change in 2025: spring then autumn); all in the past, so that the
#: memory broker's clock (the real one) never finds a tick early.
CHANGES = [
    ("Europe/Paris", (2025, 3, 30)),
    ("Europe/Paris", (2025, 10, 26)),
    ("America/New_York", (2025, 3, 9)),
    ("America/New_York", (2025, 11, 2)),
    ("Australia/Sydney", (2025, 10, 5)),
    ("Australia/Sydney", (2025, 4, 6)),
]
#: Every few minutes in real time; a fixed time in the hour skipped or repeated in each zone
#: (02:xx in Paris and Sydney, 01:59 and 02:00 in New York); a fixed time after it; and a
#: ``*`` minute within the changing hour.
CRONS = ["*/5 * * * *", "30 2 * * *", "0 2 * * *", "59 1 * * *", "0 3 * * *", "*/15 2 * * *"]
#: Most a simulated wake-up comes late, in seconds (a loaded machine).
LATENESS = 0.5


class SimulatedClock(Clock):
    """Time that moves only when the scheduler waits, each wake-up a little late at random;
    stops the scheduler at ``end``. A loop that reads the time again and again without waiting
    is spinning: the clock then ends the run."""

    def __init__(self, start: float, end: float, seed: str) -> None:
        self.now = start
        self.end = end
        self.rng = random.Random(seed)
        self.wakes: collections.Counter[int] = collections.Counter()  # per simulated hour
        self.reads = 0  # since the last wait
        self.spun = False

    def time(self) -> float:
        self.reads += 1
        if self.reads > 1000:
            self.spun = True
            raise RuntimeError(f"the scheduler spins at {self.now}")
        return self.now

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        assert seconds > 0
        self.reads = 0
        self.now += seconds + self.rng.uniform(0.0, LATENESS)
        self.wakes[int(self.now // 3600)] += 1
        return self.now >= self.end or stop.is_set()


def expected_ticks(cron: str, zone: ZoneInfo, start: float, end: float) -> list[float]:
    """The ticks of ``cron`` (minute and hour fields only) strictly between ``start`` and
    ``end``, by scanning each minute of the window."""
    minute_field, hour_field = cron.split()[:2]
    ticks: list[float] = []
    if minute_field.startswith("*") or hour_field.startswith("*"):
        step = int(minute_field.split("/")[1]) if "/" in minute_field else 1
        hours = range(24) if hour_field == "*" else {int(hour_field)}
        t = start - start % 60 + 60
        while t < end:
            wall = datetime.fromtimestamp(t, zone)
            if wall.minute % step == 0 and wall.hour in hours:
                ticks.append(t)
            t += 60
        return ticks
    at = (int(hour_field), int(minute_field))
    done: set[object] = set()  # the dates whose tick was found (or came before the window)
    t = start - start % 60 + 60
    while t < end:
        wall, before = datetime.fromtimestamp(t, zone), datetime.fromtimestamp(t - 60, zone)
        if wall.date() not in done and (wall.hour, wall.minute) >= at:
            done.add(wall.date())
            if before.date() != wall.date() or (before.hour, before.minute) < at:
                ticks.append(t)
        t += 60
    return ticks


def transition(zone: ZoneInfo, start: float, end: float) -> float:
    """The instant the zone's offset changes between ``start`` and ``end``."""
    t = start - start % 60
    offset = datetime.fromtimestamp(t, zone).utcoffset()
    while datetime.fromtimestamp(t, zone).utcoffset() == offset:
        t += 60
        assert t < end, "no change of offset in the window"
    return t


def drain(app: Hurtle) -> dict[str, list[float]]:
    consumer = app.broker.consumer(["default"])
    out: dict[str, list[float]] = collections.defaultdict(list)
    while batch := consumer.fetch(500, 0):
        for d in batch:
            headers = Message.decode(d.raw).headers
            out[headers["schedule"]].append(headers["tick"])
        consumer.ack(batch)
    consumer.close()
    return out


@pytest.mark.parametrize(("zone", "day"), CHANGES, ids=[f"{z}-{d[1]}" for z, d in CHANGES])
def test_days_of_schedules_across_a_dst_change_claim_each_tick_once(
    zone: str, day: tuple[int, int, int]
) -> None:
    tz = ZoneInfo(zone)
    app = Hurtle("memory://")
    job = app.task(lambda: None, name="job")
    for cron in CRONS:
        app.periodic(job, cron=cron, tz=zone, name=cron)
    wakes: collections.Counter[int] = collections.Counter()
    # two days either side of the change, from and to a time that is no tick
    middle = datetime(*day, 12, tzinfo=UTC).timestamp()
    start = middle - timedelta(days=2).total_seconds() + 7.25
    end = middle + timedelta(days=2).total_seconds() + 150.5
    # workers restart now and then: at random, and in and around the hour that changes
    rng = random.Random(f"{zone}{day}")
    change = transition(tz, start, end)
    restarts = sorted(
        [change + m * 60 + 0.5 for m in (-30, 5, 35, 65)]
        + [rng.uniform(start, end) for _ in range(3)]
    )
    tried = claimed_total = 0
    for begin, stop in itertools.pairwise([start, *restarts, end]):
        clock = SimulatedClock(begin, stop, seed=f"{zone}{day}{begin}")
        scheduler = Scheduler(app, clock=clock)
        scheduler.start()
        assert scheduler._thread is not None
        scheduler._thread.join(60)
        assert not scheduler._thread.is_alive(), "the simulation did not end"
        assert not clock.spun, f"the scheduler spun at {datetime.fromtimestamp(clock.now, tz)}"
        tried += scheduler.tried
        claimed_total += scheduler.claimed
        wakes.update(clock.wakes)

    claimed = drain(app)
    total = 0
    for cron in CRONS:
        expected = expected_ticks(cron, tz, start, end)
        assert expected, cron
        got = claimed.get(cron, [])
        shown = [
            datetime.fromtimestamp(t, tz).isoformat() for t in sorted(set(got) ^ set(expected))
        ]
        assert got == expected, f"{cron!r} in {zone}: ticks missed or extra: {shown}"
        total += len(expected)
    # every claim was of a tick, each asked once (one scheduler at a time, no failures, no
    # early ones)
    assert tried == claimed_total == total
    # wake-ups: at most one per MAX_SLEEP, plus one per tick, in each simulated hour
    per_hour = {
        h: sum(
            1
            for cron in CRONS
            for t in expected_ticks(cron, tz, h * 3600.0, (h + 1) * 3600.0 + 1)
            if start < t < end
        )
        for h in wakes
    }
    worst = max(wakes[h] - per_hour[h] for h in wakes)
    assert worst <= 3600 / MAX_SLEEP + 2, f"{worst} wake-ups in an hour beyond the ticks"
