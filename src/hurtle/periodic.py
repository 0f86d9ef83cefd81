"""``Schedule``: one periodic task — what to send, and when its ticks fall.

A schedule names a registered task, its arguments, and either a cron expression (parsed by
``cronsim``, in a time zone: ``zoneinfo`` names such as ``"Europe/Paris"``, UTC by default) or
``every`` seconds. Ticks are instants (Unix seconds) that every host computes alike:

* ``every=N``: the multiples of N seconds since the Unix epoch (``every=60`` ticks on each whole
  minute, whatever time a worker started);
* ``cron``: the times the expression matches in its zone, with Debian cron's rules across DST
  changes (``cronsim``): a job at a fixed time that falls in the hour skipped in spring runs at
  the end of the gap (``30 2 * * *`` at 03:00 in Paris), one in the hour repeated in autumn runs
  once, on the first pass; expressions with ``*`` in the minute or hour field follow real time
  through both. ``next_after`` is always a later instant, also from the second pass of a
  repeated hour (the scheduler sleeps until it).

This module only computes; ``hurtle.scheduler`` claims the ticks through the broker.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any, TypedDict
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ConfigurationError, EncodeError
from .message import Message
from .options import SendOptions

if TYPE_CHECKING:
    from .task import Task

#: Headers every scheduled message carries: the schedule's name and the tick (Unix seconds).
SCHEDULE_HEADER = "schedule"
TICK_HEADER = "tick"
#: Shortest and longest ``every=`` period, in seconds (a millisecond, about 31 years): ticks are
#: multiples of the period since the epoch, which must be a time a clock can show.
MIN_EVERY = 0.001
MAX_EVERY = 1e9


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """One periodic task; made by ``Hurtle.periodic``, which checks every field."""

    name: str
    task: Task[Any, Any]
    cron: str | None
    every: float | None
    tz: tzinfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    catch_up: bool

    @property
    def queue(self) -> str:
        """The queue its messages go to (the task's, or for a fair task the sub-queue of its
        arguments' key), where the broker keeps its last tick."""
        task = self.task
        return (
            task.queue
            if task.fair is None
            else task.fair.queue_of(task.queue, self.args, self.kwargs)
        )

    @property
    def unique_for(self) -> float | None:
        """The task's ``unique_for``: a tick takes the task's unique lock when it is claimed,
        and enqueues nothing while a call like it still waits or runs."""
        limits = self.task.limits
        return None if limits is None or limits.unique_for is None else float(limits.unique_for)

    def describe(self) -> str:
        """``cron '*/5 * * * *' Europe/Paris`` or ``every 10s``."""
        if self.every is not None:
            return f"every {self.every:g}s"
        return f"cron {self.cron!r} {self.tz}"

    def next_after(self, t: float) -> float:
        """The first tick strictly after ``t`` (Unix seconds)."""
        every = self.every
        if every is not None:
            k = math.floor(t / every) + 1
            while k * every <= t:
                k += 1
            while (k - 1) * every > t:
                k -= 1
            return k * every
        assert self.cron is not None
        # cronsim walks wall-clock time: from a time in the second pass of an hour repeated in
        # autumn, a fixed-time expression first yields that hour's tick of the first pass (an
        # earlier instant, already gone). Ticks are instants: skip what is not after ``t``.
        for at in CronSim(self.cron, datetime.fromtimestamp(t, self.tz)):
            tick = at.timestamp()
            if tick > t:
                return tick
        raise ConfigurationError(  # a schedule's expression is checked to fire when declared
            f"schedule {self.name!r}: cron {self.cron!r} has no tick after {t!r} in 50 years"
        )

    def last_at(self, t: float) -> float | None:
        """The last tick at or before ``t``, or ``None`` if there is none (in 50 years)."""
        every = self.every
        if every is not None:
            k = math.floor(t / every)
            while k * every > t:
                k -= 1
            while (k + 1) * every <= t:
                k += 1
            return k * every
        assert self.cron is not None
        # Cron ticks are whole seconds: looking back from within the second of ``t`` finds the
        # ticks at or before it (cronsim steps back first from a time without a fraction).
        start = datetime.fromtimestamp(math.floor(t) + 0.5, self.tz)
        try:
            last = next(CronSim(self.cron, start, reverse=True)).timestamp()
        except StopIteration:
            return None
        # Looking back from the second pass of a repeated hour misses that hour's tick (taken
        # on the first pass): step forward over the ticks that came before ``t``.
        while (later := self.next_after(last)) <= t:
            last = later
        return last

    def message(self, tick: float) -> Message:
        """The message of ``tick``: the task's call, with the schedule and tick in its headers
        (and, for a ``unique_for`` task, its lock, as ``Task.send`` names it; sealed arguments
        for an encrypted task: ``Task.message``)."""
        return self.task.message(
            self.args,
            dict(self.kwargs),
            SendOptions(headers={SCHEDULE_HEADER: self.name, TICK_HEADER: tick}),
        )


class ScheduleOptions(TypedDict, total=False):
    """The options of ``app.periodic`` (``Hurtle.periodic``): one of ``cron`` (in ``tz``, default
    UTC) or ``every`` seconds, the call's ``args`` and ``kwargs``, the schedule's ``name``
    (default: its task's) and ``catch_up`` (default True)."""

    cron: str | None
    every: float | None
    tz: str | tzinfo | None
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    name: str | None
    catch_up: bool


def make_schedule(task: Task[Any, Any], options: ScheduleOptions) -> Schedule:
    """A checked ``Schedule``; raises ``ConfigurationError`` naming the bad value, or an
    option ``app.periodic`` does not take."""
    unknown = options.keys() - ScheduleOptions.__annotations__.keys()
    if unknown:
        raise ConfigurationError(
            f"app.periodic does not take {', '.join(sorted(unknown))}: its options are "
            f"{', '.join(ScheduleOptions.__annotations__)}"
        )
    name, cron, every, tz = (
        options.get("name"),
        options.get("cron"),
        options.get("every"),
        options.get("tz"),
    )
    args, kwargs, catch_up = (
        options.get("args", ()),
        options.get("kwargs"),
        options.get("catch_up", True),
    )
    label = name if name is not None else task.name
    if not isinstance(label, str) or not label:
        raise ConfigurationError(f"a schedule name must be a non-empty str, got {name!r}")
    where = f"schedule {label!r}"
    if task.debounce is not None:
        raise ConfigurationError(
            f"{where}: task {task.name} is debounced (debounce=): a schedule's ticks are not "
            "debounced; schedule a task without debounce= (it may send the debounced one)"
        )
    if (cron is None) == (every is None):
        raise ConfigurationError(
            f"{where}: give exactly one of cron='*/5 * * * *' or every=SECONDS "
            f"(got cron={cron!r}, every={every!r})"
        )
    if every is not None:
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not MIN_EVERY <= every <= MAX_EVERY  # False for NaN
        ):
            raise ConfigurationError(
                f"{where}: every must be a number of seconds from {MIN_EVERY:g} to {MAX_EVERY:g}, "
                f"got {every!r:.60}; for longer periods use a cron expression"
            )
        if tz is not None:
            raise ConfigurationError(
                f"{where}: tz={tz!r} applies to cron schedules only; every={every!r} ticks on "
                "multiples of it since the Unix epoch, in every zone"
            )
        every = float(every)
    zone = _zone(where, tz)
    if cron is not None:
        _check_cron(where, cron, zone)
    if not isinstance(catch_up, bool):
        raise ConfigurationError(f"{where}: catch_up must be True or False, got {catch_up!r}")
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ConfigurationError(
            f"{where}: args must be a tuple or list of positional arguments, got {args!r}"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"{where}: kwargs must be a dict, got {kwargs!r}")
    schedule = Schedule(
        name=label,
        task=task,
        cron=cron,
        every=every,
        tz=zone,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        catch_up=catch_up,
    )
    # Arguments that do not fit the task, or cannot be encoded, fail now rather than each tick.
    problem = task.unfit(schedule.args, schedule.kwargs)
    if problem is not None:
        raise ConfigurationError(f"{where}: {problem}")
    try:
        schedule.message(0.0).encode()
    except EncodeError as err:
        raise ConfigurationError(f"{where}: {err}") from None
    return schedule


def _zone(where: str, tz: str | tzinfo | None) -> tzinfo:
    if tz is None:
        return UTC
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str):
        raise ConfigurationError(f"{where}: tz must be a time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ConfigurationError(
            f"{where}: unknown time zone {tz!r} ({err}); use an IANA name such as "
            "'Europe/Paris' or 'UTC' (on systems without a zone database: pip install tzdata)"
        ) from None


def _check_cron(where: str, cron: object, zone: tzinfo) -> None:
    if not isinstance(cron, str):
        raise ConfigurationError(f"{where}: cron must be a str such as '*/5 * * * *', got {cron!r}")
    try:
        next(CronSim(cron, datetime.now(zone)))
    except (CronSimError, ValueError) as err:
        raise ConfigurationError(
            f"{where}: bad cron expression {cron!r}: {err}; expected 5 fields (minute hour "
            "day-of-month month day-of-week, e.g. '*/5 * * * *'), or 6 with seconds first"
        ) from None
    except StopIteration:
        raise ConfigurationError(
            f"{where}: cron expression {cron!r} never fires (no matching time in 50 years)"
        ) from None
