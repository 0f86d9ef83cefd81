"""What the brokers share beyond their contract (``base``): the checks of arguments every store
makes the same way (a queue name's is ``hurtle.names.check_stored_queue_name``, importable
from here as ``check_queue_name``: a broker takes the names of a sharded queue's shards too),
the rate-limit arithmetic (GCRA) of the stores that do it in Python, lock keys, the log line
of trimmed dead letters, and what a message a store dead-letters itself ends (``dead_ends``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeGuard, TypeVar

from ..errors import ConfigurationError
from ..flow import FLOW, read_flow
from ..message import Message, check_messages, lock_of, salvage
from ..names import check_stored_queue_name
from ..records import member_record
from .records import FlowStep, StoredResult

if TYPE_CHECKING:
    from .base import Broker

#: The one check of a queue name, for every broker: a user's queue name or a shard's.
check_queue_name = check_stored_queue_name

log = logging.getLogger("hurtle.brokers.base")  # the name these lines were always logged under


def check_dead_letter_limits(dead_letter_max: int, dead_letter_ttl: float) -> tuple[int, float]:
    """The limits, checked: a whole number and a finite number of seconds, each ``>= 0``."""
    if (
        isinstance(dead_letter_max, bool)
        or not isinstance(dead_letter_max, int)
        or (dead_letter_max < 0)
    ):
        raise ConfigurationError(
            f"dead_letter_max must be a whole number >= 0 (0: keep every dead letter), "
            f"got {dead_letter_max!r}"
        )
    if not is_seconds(dead_letter_ttl):
        raise ConfigurationError(
            f"dead_letter_ttl must be a finite number of seconds >= 0 (0: keep dead letters "
            f"until purged), got {dead_letter_ttl!r}"
        )
    return dead_letter_max, float(dead_letter_ttl)


def log_trimmed(broker: Broker, queue: str, expired: int, dropped: int) -> None:
    """Say what a dead-letter write dropped: expiries at info, drops by the cap as a warning."""
    if expired:
        log.info(
            "dropped %d dead letters of queue %r older than dead_letter_ttl (%g s)",
            expired,
            queue,
            broker.dead_letter_ttl,
        )
    if dropped:
        log.warning(
            "dropped the %d oldest dead letters of queue %r to keep dead_letter_max (%d); "
            "raise it, or retry or purge them sooner, to keep more",
            dropped,
            queue,
            broker.dead_letter_max,
        )


def is_seconds(value: object, *, positive: bool = False) -> TypeGuard[int | float]:
    """Whether ``value`` is a finite int or float (not a bool) >= 0, or > 0 with ``positive``."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )


def check_cancel_ttl(ttl: object) -> float:
    """A cancellation's ttl, checked: a finite number of seconds > 0."""
    if not is_seconds(ttl, positive=True):
        raise ConfigurationError(
            f"a cancellation's ttl must be a finite number of seconds > 0, got {ttl!r}"
        )
    return float(ttl)


def gcra(
    tat: float, now: float, limit: int, period: float, wanted: int
) -> tuple[int, float, float]:
    """Generic cell rate: ``(granted, wait, new tat)`` for ``wanted`` tokens of a key whose
    theoretical arrival time is ``tat``. Tokens come evenly, one every ``period / limit``
    seconds, and at most ``burst(limit)`` are taken at once, so any period holds at most about
    ``limit`` starts. The memory and SQLite brokers use it; ``lua/rate.lua`` is the same."""
    interval = period / limit
    tolerance = (burst(limit) - 1) * interval
    tat = max(tat, now)
    room = math.floor((now + tolerance - tat) / interval + 1e-4) + 1
    granted = max(0, min(wanted, room))
    tat += granted * interval
    wait = 0.0 if granted == wanted else max(tat - tolerance - now, 0.0)
    return granted, wait, tat


def burst(limit: int) -> int:
    """Most tokens of a rate limit taken at once: a tenth of the limit, at least 2 (so that a
    worker that comes a little late for its token does not lose it)."""
    return max(2, limit // 10)


def unique_key_of(message: Message) -> str:
    """The unique lock key a message names (``Message.unique``, or the header older senders
    named it in), checked."""
    lock = lock_of(message)
    if lock is None:
        raise ConfigurationError(
            f"message {message.id} of task {message.task!r} has no unique key: "
            "publish_unique needs unique (a non-empty str) on every message"
        )
    return lock[0]


def lock_end(message: Message, now: float, unique_for: float) -> float:
    """When the unique lock of ``message`` ends: its ``unique_until`` (the sender's ``created``
    plus ``unique_for``) when it names one, else ``now + unique_for``."""
    lock = lock_of(message)
    if lock is not None and lock[1] > 0:
        return lock[1]
    return now + unique_for


def lost_reason(deaths: int, max_recoveries: int) -> str:
    """The reason of a message dead-lettered because its workers kept dying: the same words on
    every broker (``lua/heartbeat.lua`` too)."""
    return f"its worker died {deaths} times while holding it (max_recoveries is {max_recoveries})"


#: Seconds the records of a message a broker dead-letters itself are kept (a day, as results).
LOST_TTL = 86400.0
#: ``TaskFailed.type`` of those records.
WORKER_LOST = "WorkerLost"


class DeadEnds(NamedTuple):
    """What ends with a message a broker dead-letters itself, in the same step of the store."""

    #: Records to store: its own, and its workflow's when it is a member.
    records: list[StoredResult]
    #: Its unique lock, ``(key, message id, until)``: ended while it still holds that id.
    lock: tuple[str, str, float] | None


def dead_ends(raw: bytes, reason: str) -> DeadEnds:
    """What the message in ``raw`` ends when the broker dead-letters it itself (its workers kept
    dying), as a worker's dead letters do (``worker.ends``): a ``dead`` record (``WorkerLost``,
    the reason as its message, naming the message: ``records.member_record``) under its own id
    — the broker cannot tell whether its task keeps results, so it writes one whatever the
    task, kept ``LOST_TTL`` — and under its workflow's id when it is a member, so that whatever
    waits on it raises at once; and its unique lock, so that the same call sent again runs."""
    message = salvage(raw)
    if message is None:  # not even an id: nothing waits on it
        return DeadEnds([], None)
    record = member_record("dead", message, None, reason, WORKER_LOST)
    records = [StoredResult(message.id, record, LOST_TTL)]
    if message.headers and FLOW in message.headers:
        try:
            flow_id = read_flow(message).id
        except Exception:  # a header that is no workflow's: nothing more to fail
            flow_id = message.id
        if flow_id != message.id:
            records.append(StoredResult(flow_id, record, LOST_TTL))
    lock = lock_of(message)
    return DeadEnds(records, None if lock is None else (lock[0], message.id, lock[1]))


#: What recovery does with a message its worker died holding (``fate``).
BACK, QUARANTINE, DEAD = "back", "quarantine", "dead"


def suspects(probes: list[bool]) -> list[bool]:
    """Which of the messages one dead worker held may have killed it, given which of them were
    let out of quarantine one at a time (probes): the only message it held, or its only probe."""
    if len(probes) == 1:
        return [True]
    lone = sum(probes) == 1
    return [probe and lone for probe in probes]


def fate(deaths: int, suspect: bool, max_recoveries: int) -> str:
    """What recovery does with a message whose worker died holding it, ``deaths`` times now:
    a suspect past ``max_recoveries`` becomes a dead letter (``DEAD``); one that died before
    waits in quarantine to be let out alone (``QUARANTINE``); a first death goes back
    (``BACK``)."""
    if suspect and deaths > max_recoveries:
        return DEAD
    return QUARANTINE if deaths >= 2 else BACK


Item = TypeVar("Item")


def check_steps(steps: Sequence[FlowStep]) -> None:
    """Check the messages workflow steps publish (their next links, their chords' callbacks)
    before anything of them is settled. A chord's callback shared by its members' steps (the
    worker makes it once per batch) is checked once."""
    seen: set[int] = set()
    for step in steps:
        check_messages(step.publish)
        if step.chord is not None and id(step.chord.callback) not in seen:
            seen.add(id(step.chord.callback))
            check_messages([step.chord.callback])


def flow_items(
    steps: Sequence[FlowStep], item: Callable[[Message], Item]
) -> list[tuple[list[Item], Item | None]]:
    """Per workflow step, its messages to publish and its chord's callback, checked and made
    into a store's items (``item``) before anything is settled: a message that cannot be
    encoded settles nothing. A callback shared by several steps is made into an item once."""
    check_steps(steps)
    callbacks: dict[int, Item] = {}
    out: list[tuple[list[Item], Item | None]] = []
    for step in steps:
        callback: Item | None = None
        if step.chord is not None:
            c = step.chord.callback
            if (callback := callbacks.get(id(c))) is None:
                callback = callbacks[id(c)] = item(c)
        out.append(([item(m) for m in step.publish], callback))
    return out
