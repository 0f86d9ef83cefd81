"""Periodic tasks: declaring schedules, computing their ticks (cron in time zones, across DST),
and the scheduler's claims — catch-up of a missed tick, late wake-ups, several schedulers."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any, NoReturn
from zoneinfo import ZoneInfo

import pytest

from helpers import RedisServer
from hurtle import ConfigurationError, Hurtle, Message
from hurtle.brokers import Broker
from hurtle.brokers.ticks import TICK_SKEW
from hurtle.errors import BrokerError
from hurtle.middleware import Middleware
from hurtle.periodic import Schedule
from hurtle.scheduler import MAX_OWED, Clock, Scheduler
from hurtle.worker.processor import Job

PARIS = ZoneInfo("Europe/Paris")


def paris(*fields: int, fold: int = 0) -> float:
    return datetime(*fields, tzinfo=PARIS, fold=fold).timestamp()  # type: ignore[misc]


def utc(*fields: int) -> float:
    return datetime(*fields, tzinfo=UTC).timestamp()  # type: ignore[misc]


def in_paris(t: float | None) -> str:
    assert t is not None
    return datetime.fromtimestamp(t, PARIS).strftime("%Y-%m-%d %H:%M:%S %Z")


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://")


def ticks_queued(broker: Broker, queue: str = "default") -> list[float]:
    consumer = broker.consumer([queue])
    out: list[float] = []
    while batch := consumer.fetch(100, 0):
        out += [Message.decode(d.raw).headers["tick"] for d in batch]
        consumer.ack(batch)
    consumer.close()
    return out


# -- declaring ------------------------------------------------------------------------------


def test_periodic_registers_a_schedule_of_a_registered_task(app: Hurtle) -> None:
    @app.task
    def report(day: str, *, full: bool = False) -> None: ...

    s = app.periodic(
        report,
        cron="*/5 * * * *",
        tz="Europe/Paris",
        args=("mon",),
        kwargs={"full": True},
        name="weekly",
    )
    assert app.schedules == {"weekly": s}
    assert (s.cron, s.every, s.tz, s.args, s.kwargs) == (
        "*/5 * * * *",
        None,
        PARIS,
        ("mon",),
        {"full": True},
    )
    assert s.catch_up is True and s.queue == "default"
    m = s.message(1234.0)
    assert (m.task, m.args, m.kwargs) == (report.name, ("mon",), {"full": True})
    assert m.headers == {"schedule": "weekly", "tick": 1234.0}


def test_the_decorator_form_stacks_above_app_task_and_returns_the_task(app: Hurtle) -> None:
    @app.periodic(every=10)
    @app.task(queue="beats")
    def beat() -> str:
        return "ok"

    assert beat() == "ok"  # still the task, callable locally
    s = app.schedules[beat.name]  # named after the task by default
    assert (s.every, s.queue, s.task) == (10.0, "beats", beat)


def test_two_schedules_of_one_task_need_names_of_their_own(app: Hurtle) -> None:
    @app.task
    def ping() -> None: ...

    app.periodic(ping, every=1)
    with pytest.raises(ConfigurationError, match=r"two schedules are named '.*ping'.*name="):
        app.periodic(ping, every=2)
    app.periodic(ping, every=2, name="ping-slow")
    assert len(app.schedules) == 2


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cron": "61 * * * *"}, r"bad cron expression '61 \* \* \* \*': Bad minute"),
        ({"cron": "* * *"}, r"bad cron expression '\* \* \*'.*5 fields"),
        ({"cron": "0 0 31 2 *"}, r"cron expression '0 0 31 2 \*'"),
        ({"cron": 5}, r"cron must be a str"),
        ({"every": 0}, r"every must be a number of seconds from 0.001 to 1e\+09, got 0"),
        ({"every": 1e-300}, r"from 0.001 to 1e\+09, got 1e-300"),
        ({"every": 1e300}, r"got 1e\+300"),
        ({"every": float("nan")}, r"got nan"),
        ({"every": -1.5}, r"got -1.5"),
        ({"every": float("inf")}, r"got inf"),
        ({"every": True}, r"got True"),
        ({"every": "10"}, r"got '10'"),
        ({}, r"exactly one of cron=.* or every="),
        ({"every": 1, "cron": "* * * * *"}, r"exactly one of"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, r"unknown time zone 'Mars/Olympus'"),
        ({"cron": "* * * * *", "tz": "../etc"}, r"unknown time zone '../etc'"),
        ({"every": 5, "tz": "Europe/Paris"}, r"tz='Europe/Paris' applies to cron schedules only"),
        ({"every": 5, "name": ""}, r"name must be a non-empty str"),
        ({"every": 5, "args": (1, 2)}, r"do not fit"),
        ({"every": 5, "args": "ab"}, r"args must be a tuple or list"),
        ({"every": 5, "args": (object(),)}, r"schedule .*: .*object"),
        ({"evry": 5}, r"app.periodic does not take evry: its options are cron, every, tz, args"),
    ],
)
def test_bad_schedules_are_refused_naming_the_value(
    app: Hurtle, options: dict[str, object], match: str
) -> None:
    @app.task
    def job(x: object = None) -> None: ...

    with pytest.raises(ConfigurationError, match=match):
        app.periodic(job, **options)  # type: ignore[arg-type]
    assert app.schedules == {}


def test_periodic_refuses_what_is_not_a_task_of_this_app(app: Hurtle) -> None:
    other = Hurtle("memory://")

    @other.task
    def theirs() -> None: ...

    def plain() -> None: ...

    with pytest.raises(ConfigurationError, match="registered on this app"):
        app.periodic(theirs, every=1)
    with pytest.raises(ConfigurationError, match=r"@app.periodic goes above @app.task"):
        app.periodic(every=1)(plain)  # type: ignore[arg-type]


# -- ticks ----------------------------------------------------------------------------------


def test_every_ticks_on_multiples_of_its_period_since_the_epoch(app: Hurtle) -> None:
    @app.task
    def job() -> None: ...

    s = app.periodic(job, every=10)
    assert s.next_after(1_000_003.2) == 1_000_010.0
    assert s.next_after(1_000_010.0) == 1_000_020.0  # strictly after
    assert s.last_at(1_000_010.0) == 1_000_010.0  # at or before
    assert s.last_at(1_000_019.9) == 1_000_010.0
    fast = app.periodic(job, every=0.25, name="fast")
    t = 1_700_000_000.1
    nxt = fast.next_after(t)
    assert t < nxt <= t + 0.25 and fast.last_at(nxt) == nxt


def test_cron_follows_its_time_zone_across_both_dst_changes_of_paris(app: Hurtle) -> None:
    @app.task
    def job() -> None: ...

    s = app.periodic(job, cron="0 9 * * *", tz="Europe/Paris")
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer
    assert s.next_after(utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 7)
    assert s.next_after(utc(2026, 3, 27, 12)) == utc(2026, 3, 28, 8)
    assert s.next_after(utc(2026, 10, 24, 12)) == utc(2026, 10, 25, 8)
    assert s.last_at(utc(2026, 10, 25, 12)) == utc(2026, 10, 25, 8)


def test_a_fixed_time_in_the_skipped_hour_runs_at_the_end_of_the_gap_once(app: Hurtle) -> None:
    """Spring forward in Paris (2026-03-29, 02:00 -> 03:00): ``30 2 * * *`` runs at 03:00."""

    @app.task
    def job() -> None: ...

    s = app.periodic(job, cron="30 2 * * *", tz="Europe/Paris")
    day = s.next_after(paris(2026, 3, 28, 12))
    assert in_paris(day) == "2026-03-29 03:00:00 CEST"
    assert in_paris(s.next_after(day)) == "2026-03-30 02:30:00 CEST"
    assert in_paris(s.next_after(paris(2026, 3, 27, 12))) == "2026-03-28 02:30:00 CET"
    # looking back agrees with looking forward
    assert s.last_at(day) == day
    assert s.last_at(day + 3600) == day
    assert s.last_at(day - 1) == paris(2026, 3, 28, 2, 30)


def test_a_fixed_time_in_the_repeated_hour_runs_once(app: Hurtle) -> None:
    """Fall back in Paris (2026-10-25, 03:00 CEST -> 02:00 CET): 02:30 comes twice, runs once."""

    @app.task
    def job() -> None: ...

    s = app.periodic(job, cron="30 2 * * *", tz="Europe/Paris")
    first = s.next_after(paris(2026, 10, 24, 12))
    assert first == paris(2026, 10, 25, 2, 30, fold=0)  # the first 02:30 (CEST)
    assert in_paris(first) == "2026-10-25 02:30:00 CEST"
    assert in_paris(s.next_after(first)) == "2026-10-26 02:30:00 CET"  # not the second 02:30
    assert s.last_at(paris(2026, 10, 25, 2, 45, fold=1)) == first


@pytest.mark.parametrize(
    ("zone", "cron", "now", "expected_next", "expected_last"),
    [
        # the clock at 02:05 of the second pass; 02:30 ran on the first pass
        (
            "Europe/Paris",
            "30 2 * * *",
            (2024, 10, 27, 2, 5),
            (2024, 10, 28, 2, 30),
            (2024, 10, 27, 2, 30),
        ),
        (
            "Europe/Paris",
            "0,30 2 * * *",
            (2024, 10, 27, 2, 45),
            (2024, 10, 28, 2, 0),
            (2024, 10, 27, 2, 30),
        ),
        (
            "America/New_York",
            "59 1 * * *",
            (2024, 11, 3, 1, 0),
            (2024, 11, 4, 1, 59),
            (2024, 11, 3, 1, 59),
        ),
        (
            "Australia/Sydney",
            "30 2 * * *",
            (2025, 4, 6, 2, 10),
            (2025, 4, 7, 2, 30),
            (2025, 4, 6, 2, 30),
        ),
    ],
)
def test_in_the_second_pass_of_a_repeated_hour_the_next_tick_is_a_later_instant(
    app: Hurtle,
    zone: str,
    cron: str,
    now: tuple[int, ...],
    expected_next: tuple[int, ...],
    expected_last: tuple[int, ...],
) -> None:
    """Ticks are instants: from the second pass of the hour repeated in autumn, the next tick
    is tomorrow's, not the first pass's (already gone), and the last is the first pass's."""

    @app.task
    def job() -> None: ...

    tz = ZoneInfo(zone)
    s = app.periodic(job, cron=cron, tz=zone)
    t = datetime(*now, tzinfo=tz, fold=1).timestamp()  # type: ignore[misc]
    assert s.next_after(t) == datetime(*expected_next, tzinfo=tz).timestamp()  # type: ignore[misc]
    assert s.last_at(t) == datetime(*expected_last, tzinfo=tz, fold=0).timestamp()  # type: ignore[misc]


def test_a_scheduler_in_the_second_pass_of_a_repeated_hour_waits_for_tomorrow(
    app: Hurtle,
) -> None:
    """The clock at 02:05 of the second pass, 02:30 claimed on the first: nothing is due, and
    the scheduler's next look is at tomorrow's 02:30, not at once (it used to spin)."""

    @app.task
    def job() -> None: ...

    s = app.periodic(job, cron="30 2 * * *", tz="Europe/Paris")
    first = paris(2024, 10, 27, 2, 30, fold=0)
    app.broker.claim_tick(s.queue, s.name, first, [s.message(first)])
    ticks_queued(app.broker)
    now = paris(2024, 10, 27, 2, 5, fold=1)
    scheduler = Scheduler(app)
    scheduler.begin(now)
    for _ in range(3):
        scheduler.run_due(now)
    assert scheduler.tried == 0
    assert ticks_queued(app.broker) == []
    assert scheduler.run_due(now) == paris(2024, 10, 28, 2, 30)


def test_an_every_few_minutes_cron_keeps_real_time_through_dst_changes(app: Hurtle) -> None:
    @app.task
    def job() -> None: ...

    s = app.periodic(job, cron="*/30 * * * *", tz="Europe/Paris")
    for start in (paris(2026, 3, 29, 1), paris(2026, 10, 25, 1)):
        ticks = [start]
        for _ in range(6):
            ticks.append(s.next_after(ticks[-1]))
        assert [b - a for a, b in pairwise(ticks)] == [1800.0] * 6
    autumn = [paris(2026, 10, 25, 1)]
    for _ in range(5):
        autumn.append(s.next_after(autumn[-1]))
    assert [in_paris(t)[11:] for t in autumn] == [
        "01:00:00 CEST",
        "01:30:00 CEST",
        "02:00:00 CEST",
        "02:30:00 CEST",
        "02:00:00 CET",
        "02:30:00 CET",
    ]


def test_cron_with_seconds_and_utc_by_default(app: Hurtle) -> None:
    @app.task
    def job() -> None: ...

    s = app.periodic(job, cron="*/15 * * * * *")
    assert s.tz is UTC
    assert s.next_after(utc(2026, 1, 1, 0, 0, 7)) == utc(2026, 1, 1, 0, 0, 15)
    assert s.last_at(utc(2026, 1, 1, 0, 0, 15) + 0.5) == utc(2026, 1, 1, 0, 0, 15)


# -- the scheduler's claims -----------------------------------------------------------------


def _every_10(app: Hurtle, **options: object) -> Schedule:
    @app.task
    def job() -> None: ...

    return app.periodic(job, every=10, **options)  # type: ignore[call-overload, no-any-return]


def test_a_missed_tick_runs_once_when_a_scheduler_starts(app: Hurtle) -> None:
    s = _every_10(app)
    app.broker.claim_tick(s.queue, s.name, 1000.0, [s.message(1000.0)])
    ticks_queued(app.broker)
    # workers were down from 1000 to 1075: ticks 1010 .. 1070 were missed
    Scheduler(app).begin(1075.0)
    assert ticks_queued(app.broker) == [1070.0]
    assert app.broker.last_tick(s.queue, s.name) == 1070.0


def test_catch_up_false_skips_the_missed_tick_and_waits_for_the_next(app: Hurtle) -> None:
    s = _every_10(app, catch_up=False)
    app.broker.claim_tick(s.queue, s.name, 1000.0, [s.message(1000.0)])
    ticks_queued(app.broker)
    scheduler = Scheduler(app)
    scheduler.begin(1075.0)
    assert ticks_queued(app.broker) == []
    assert app.broker.last_tick(s.queue, s.name) == 1000.0
    scheduler.run_due(1079.9)
    assert ticks_queued(app.broker) == []
    scheduler.run_due(1080.0)
    assert ticks_queued(app.broker) == [1080.0]


def test_a_schedule_that_never_ran_starts_with_its_next_tick(app: Hurtle) -> None:
    s = _every_10(app)
    scheduler = Scheduler(app)
    scheduler.begin(1075.0)
    assert ticks_queued(app.broker) == []
    assert app.broker.last_tick(s.queue, s.name) is None
    scheduler.run_due(1080.5)
    assert ticks_queued(app.broker) == [1080.0]


def test_a_scheduler_started_while_others_ran_catches_up_nothing(app: Hurtle) -> None:
    s = _every_10(app)
    app.broker.claim_tick(s.queue, s.name, 1070.0, [s.message(1070.0)])
    ticks_queued(app.broker)
    Scheduler(app).begin(1075.0)
    assert ticks_queued(app.broker) == []


def test_a_scheduler_that_wakes_late_claims_only_the_latest_due_tick(app: Hurtle) -> None:
    _every_10(app)
    scheduler = Scheduler(app)
    scheduler.begin(1000.5)
    scheduler.run_due(1035.0)
    assert ticks_queued(app.broker) == [1030.0]
    scheduler.run_due(1039.0)
    assert ticks_queued(app.broker) == []
    scheduler.run_due(1040.0)
    assert ticks_queued(app.broker) == [1040.0]


class _Manual(Clock):
    """A clock that moves only when told."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def test_ticks_that_come_due_while_the_broker_takes_a_claim_are_claimed_after_it(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that hangs for 25 s (a database server going away and coming back under it, a
    pool waiting for a connection) and then succeeds: the ticks that came due meanwhile are
    owed, as after a claim that failed, not skipped as by a scheduler that woke late."""
    _every_10(app)
    clock = _Manual(1000.5)
    scheduler = Scheduler(app, clock=clock)
    scheduler.begin(clock.now)
    claim = app.broker.claim_tick
    hung = []

    def slow_claim(*args: Any, **kwargs: Any) -> Any:
        if not hung:
            hung.append(True)
            clock.now += 25.0
        return claim(*args, **kwargs)

    monkeypatch.setattr(app.broker, "claim_tick", slow_claim)
    clock.now = 1010.0
    scheduler.run_due(clock.now)
    assert clock.now == 1035.0
    scheduler.run_due(clock.now)
    assert ticks_queued(app.broker) == [1010.0, 1020.0, 1030.0]


def test_several_schedulers_enqueue_each_tick_once(app: Hurtle) -> None:
    _every_10(app)
    schedulers = [Scheduler(app) for _ in range(3)]
    for s in schedulers:
        s.begin(1000.5)
    for now in (1010.0, 1020.2, 1030.1):
        for s in schedulers:
            s.run_due(now)
    assert ticks_queued(app.broker) == [1010.0, 1020.0, 1030.0]
    assert sum(s.claimed for s in schedulers) == 3


class _Ticks(Middleware):
    def __init__(self) -> None:
        self.ticks: list[float] = []

    def before_process(self, job: Job) -> None:
        self.ticks.append(job.message.headers["tick"])


def test_a_worker_runs_the_scheduler_and_its_task_sees_the_tick(app: Hurtle) -> None:
    _every_short = app.task(lambda: None, name="beat")
    app.periodic(_every_short, every=0.05)
    seen = _Ticks()
    worker = app.worker(middleware=[seen])
    thread = worker.run_in_thread()
    deadline = time.monotonic() + 30
    while len(seen.ticks) < 3:
        assert time.monotonic() < deadline, "the scheduler enqueued nothing"
        time.sleep(0.01)
    worker.stop()
    thread.join(30)
    assert len(set(seen.ticks)) == len(seen.ticks)  # no tick twice
    assert all(round(t / 0.05) * 0.05 == t for t in seen.ticks)  # ticks on the period
    assert worker.scheduler is not None and worker.scheduler.claimed >= 3


@pytest.mark.parametrize("scheduler", [True, False])
def test_a_burst_worker_catches_up_a_missed_tick_unless_told_not_to_schedule(
    app: Hurtle, scheduler: bool
) -> None:
    s = app.periodic(app.task(lambda: None, name="beat"), every=3600)
    app.broker.claim_tick(s.queue, s.name, 3600.0, [s.message(3600.0)])
    ticks_queued(app.broker)
    seen = _Ticks()
    worker = app.worker(scheduler=scheduler, burst=True, middleware=[seen])
    due = s.last_at(time.time())
    worker.run()  # the catch-up claim happens before the first fetch: the burst runs it
    assert (worker.scheduler is not None) is scheduler
    assert seen.ticks == ([due] if scheduler else [])
    assert app.broker.last_tick(s.queue, s.name) == (due if scheduler else 3600.0)


def test_a_scheduler_thread_stops_promptly_between_ticks(app: Hurtle) -> None:
    app.periodic(app.task(lambda: None, name="rare"), cron="0 0 1 1 *")
    scheduler = Scheduler(app)
    scheduler.start()
    assert scheduler._thread is not None and scheduler._thread.is_alive()
    scheduler.stop(timeout=10)
    assert not scheduler._thread.is_alive()


# -- a broker that fails, a clock that runs ahead, unique tasks -----------------------------


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_tick_that_falls_in_a_broker_outage_is_claimed_once_it_is_back(
    make_redis_server: Callable[..., RedisServer], catch_up: bool
) -> None:
    """Redis is down at the ticks 1010 and 1020: the scheduler owes them and claims them once
    it answers again, in order (with ``catch_up=False``, only the latest)."""
    server = make_redis_server(appendonly=True)
    app = Hurtle(server.url)
    try:
        _every_10(app, catch_up=catch_up)
        scheduler = Scheduler(app)
        scheduler.begin(1000.5)
        server.stop()
        scheduler.run_due(1010.0)
        scheduler.run_due(1020.0)
        assert scheduler.claimed == 0
        server.start()
        scheduler.run_due(1025.0)  # the retry is due (within RETRY_MOST of the last failure)
        assert ticks_queued(app.broker) == ([1010.0, 1020.0] if catch_up else [1020.0])
        scheduler.run_due(1030.0)
        assert ticks_queued(app.broker) == [1030.0]
    finally:
        app.close()


def test_a_scheduler_started_in_a_broker_outage_catches_up_before_claiming_newer_ticks(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    """Tick 1010 was missed; the scheduler starts at 1015 while Redis is down, so it cannot
    read the last tick. Once Redis answers, it claims 1010 before 1020: a newer tick claimed
    first would shut out the missed one for good."""
    server = make_redis_server(appendonly=True)
    app = Hurtle(server.url)
    try:
        s = _every_10(app)
        app.broker.claim_tick(s.queue, s.name, 1000.0, [s.message(1000.0)])
        ticks_queued(app.broker)
        server.stop()
        scheduler = Scheduler(app)
        scheduler.begin(1015.0)
        server.start()
        scheduler.run_due(1021.0)
        assert ticks_queued(app.broker) == [1010.0, 1020.0]
    finally:
        app.close()


def test_after_a_long_outage_only_the_latest_tick_is_claimed(app: Hurtle) -> None:
    """More than MAX_OWED ticks came due while the broker failed: as after a restart, only
    the latest runs."""

    _every_10(app)
    scheduler = Scheduler(app)
    scheduler.begin(1000.5)
    broker = app.broker
    real = broker.claim_tick
    broker.claim_tick = _refuse  # type: ignore[method-assign]
    try:
        scheduler.run_due(1010.0)
    finally:
        broker.claim_tick = real  # type: ignore[method-assign]
    now = 1010.0 + 10 * (MAX_OWED + 5)
    scheduler.run_due(now)
    assert ticks_queued(app.broker) == [now]


def _refuse(*args: object, **kwargs: object) -> NoReturn:
    raise BrokerError("cannot reach the broker")


def test_a_scheduler_whose_clock_runs_ahead_records_no_tick_before_its_time(app: Hurtle) -> None:
    """A scheduler a minute ahead is told its tick is early and records nothing; the
    schedulers whose clocks are right claim theirs."""
    s = _every_10(app)
    now = time.time()
    ahead, right = Scheduler(app), Scheduler(app)
    ahead.begin(now + 60 - 20)
    right.begin(now - 20)
    ahead.run_due(now + 60)
    assert app.broker.last_tick(s.queue, s.name) is None
    assert ahead.claimed == 0
    assert ahead.tried == 1
    right.run_due(now)
    assert ticks_queued(app.broker) == [s.last_at(now)]


class _Ahead(Clock):
    """A clock 3 s ahead: enough to be refused, short enough to wait for its first tick."""

    def time(self) -> float:
        return time.time() + 3.0


def test_a_lone_scheduler_whose_clock_runs_ahead_enqueues_each_tick_on_the_brokers_time(
    app: Hurtle,
) -> None:
    s = app.periodic(app.task(lambda: None, name="beat"), every=0.2)
    scheduler = Scheduler(app, clock=_Ahead())
    scheduler.start()
    seen: list[float] = []
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 3:
            assert time.monotonic() < deadline, "nothing was enqueued"
            last = app.broker.last_tick(s.queue, s.name)
            assert last is None or last <= time.time() + TICK_SKEW
            for tick in ticks_queued(app.broker):
                assert tick <= time.time() + TICK_SKEW
                seen.append(tick)
            time.sleep(0.02)
    finally:
        scheduler.stop()
    assert seen == sorted(set(seen))


def test_ticks_of_a_unique_task_enqueue_nothing_while_a_call_holds_its_lock(
    app: Hurtle,
) -> None:
    @app.task(unique_for=60)
    def slow() -> None: ...

    s = app.periodic(slow, every=10)
    scheduler = Scheduler(app)
    scheduler.begin(1000.5)
    scheduler.run_due(1010.0)
    scheduler.run_due(1020.0)  # the call of 1010 still waits: its lock is held
    assert scheduler.claimed == 2
    assert app.broker.last_tick(s.queue, s.name) == 1020.0
    consumer = app.broker.consumer([s.queue])
    batch = consumer.fetch(10, 0)
    assert [Message.decode(d.raw).headers["tick"] for d in batch] == [1010.0]
    message = Message.decode(batch[0].raw)
    assert message.unique == slow.limits.unique_key_of((), {})  # type: ignore[union-attr]
    # settled, the call lets its lock go: the next tick runs
    consumer.ack(batch)
    consumer.release_unique([(s.queue, message.unique, message.id, message.unique_until)])
    consumer.close()
    scheduler.run_due(1030.0)
    assert ticks_queued(app.broker) == [1030.0]
