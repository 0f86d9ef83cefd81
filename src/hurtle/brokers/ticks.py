"""Tick claims (``Broker.claim_tick``): what a claim answers, which ticks a broker still takes,
the clock skew it tolerates, the checks of a claim's arguments, and the checked claim
(``TickBatch``) that each broker stores.

A broker keeps, per schedule, its last tick and the ``RECENT_TICKS`` latest ticks claimed. A
tick among them is claimed already; a tick older than all of them (once that many are kept) is
too old to tell, and refused; any other is claimed, even when newer ones were claimed before
it: a scheduler that owes ticks from a broker outage can still claim them after another, which
began meanwhile, claimed a newer one.

A claim is judged by the broker's clock (Redis ``TIME``; the local clock for the memory and
SQLite brokers, which share their host; the server's time for NATS): a tick more than
``TICK_SKEW`` seconds ahead of it is refused as early, and nothing is recorded, so a scheduler
on a host whose clock runs ahead can neither enqueue a tick long before its time nor shut out
the schedulers whose clocks are right. The answer says how early, and the scheduler claims the
tick again then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from ..errors import ConfigurationError
from ..message import Message
from .common import is_seconds

#: How many of a schedule's latest claimed ticks a broker keeps (``claimable``).
RECENT_TICKS = 256

#: How far ahead of the broker's clock (seconds) a tick may be and still be claimed: a host whose
#: clock runs up to this much ahead enqueues its ticks up to this early; one further ahead is
#: told to wait for the broker's time.
TICK_SKEW = 1.0


class TickClaim(msgspec.Struct, frozen=True, gc=False):
    """What one ``Broker.claim_tick`` did."""

    #: This call recorded the tick (and published its messages, but see ``held_by``).
    won: bool
    #: Seconds by which the tick is ahead of the broker's clock, beyond ``TICK_SKEW``: the claim
    #: was refused and nothing changed; claim it again that much later. 0 otherwise.
    early: float = 0.0
    #: With ``unique_for``: the id of the message that holds the unique lock when this call won
    #: the tick but published nothing (a call like it still waits or runs); else None.
    held_by: str | None = None


class TickBatch(msgspec.Struct, frozen=True):
    """A tick claim that ``Broker.claim_tick`` checked and encoded: what the broker's
    ``_store_tick`` records and publishes in one atomic step."""

    #: The queue of the schedule's record and of every message.
    queue: str
    #: The schedule's name.
    name: str
    #: The tick claimed (Unix seconds).
    tick: float
    messages: Sequence[Message]
    #: ``payloads[i]`` is ``messages[i]`` encoded.
    payloads: list[bytes]
    #: With ``unique_for``, ``keys[i]`` is the unique lock key of ``messages[i]``; else None.
    keys: list[str] | None
    #: The task's ``unique_for`` (seconds), or None.
    unique_for: float | None


#: The answers that carry nothing but the outcome, made once.
WON = TickClaim(True)
TAKEN = TickClaim(False)


def claimable(tick: float, recent: list[float], last: float | None) -> bool:
    """Whether ``tick`` may be claimed, given the schedule's ``recent`` claimed ticks (sorted)
    and its ``last``: not among them, and not older than all of them once ``RECENT_TICKS``
    are kept. A record of an older hurtle (a last tick, no recent ones) takes newer ticks only.
    """
    if not recent:
        return last is None or tick > last
    if tick in recent:
        return False
    return len(recent) < RECENT_TICKS or tick > recent[0]


def remember(tick: float, recent: list[float]) -> list[float]:
    """``recent`` with ``tick`` added, sorted, cut to the ``RECENT_TICKS`` latest."""
    out = sorted([*recent, tick])
    return out[-RECENT_TICKS:]


def too_early(tick: float, now: float) -> TickClaim | None:
    """The refusal of a claim of ``tick`` at the broker's ``now``, or None if it may go on."""
    if tick > now + TICK_SKEW:
        return TickClaim(False, early=tick - now)
    return None


def check_tick_claim(
    queue: str, tick: float, messages: Sequence[Message], unique_for: float | None = None
) -> None:
    """Refuse a tick claim whose messages are not all of ``queue``, a tick that is no time, or
    a ``unique_for`` that is no number of seconds > 0."""
    if isinstance(tick, bool) or not isinstance(tick, int | float) or not math.isfinite(tick):
        raise ConfigurationError(f"a tick must be a finite Unix time, got {tick!r}")
    if not messages:
        raise ConfigurationError("a tick claim needs at least one message to publish")
    for m in messages:
        if m.queue != queue:
            raise ConfigurationError(
                f"a tick claim of queue {queue!r} holds a message of queue {m.queue!r}: the "
                "schedule's record and its messages must share one queue"
            )
    if unique_for is not None and not is_seconds(unique_for, positive=True):
        raise ConfigurationError(
            f"unique_for of a tick claim must be a finite number of seconds > 0, got {unique_for!r}"
        )
