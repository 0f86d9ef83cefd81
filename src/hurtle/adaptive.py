"""Adaptive rate limits: how a key's rate is cut when its calls raise ``Throttle``, and how it
climbs back (additive increase, multiplicative decrease).

A rate limit that was never cut runs at its configured rate and costs nothing here. A cut is a
record per key, kept in the broker so that every worker shares it (``Broker.put_rate_cuts``,
``get_rate_cuts``, over the progress store): when it was made and the share of the configured
rate left right after it. From that record alone, the share at any time is known without a
write: it climbs back linearly, to the rate before the cut within ``RECOVER`` seconds, and on
until it is the whole limit again (by at least ``1 / RISE`` of it per second).

A throttled call cuts its key's rate by ``DECREASE`` only if it started after the key's last
cut, and that cut is ``HOLD`` seconds old: calls that ran at the old rate, whose 429s say
nothing about the new one, leave it be.
The floor is one token per period. ``cut`` reads and writes the records of a batch's keys in
one call each; two workers that cut one key at the same moment both halve it once (the last
write wins).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple, Protocol

from .errors import Throttle

#: A cut leaves this share of the key's rate at the time of the cut.
DECREASE = 0.5
#: Seconds a cut key takes to climb back to the rate it had before its last cut.
RECOVER = 5.0
#: A cut key climbs by at least ``1 / RISE`` of its configured rate per second.
RISE = 60.0
#: Seconds after a cut during which its key is not cut again: the calls that began before it,
#: or took their tokens before it, still end in 429s that say nothing of the new rate.
HOLD = 0.5
#: Seconds a cut's record outlives the time its key is whole again.
KEEP = 60.0
#: Seconds a ``Throttle()`` without ``retry_after`` puts its call back for, give or take half.
RETRY_AFTER = 1.0


class Cut(NamedTuple):
    """A key's last cut: its time (``time.time()`` of the worker that made it) and the share
    of the configured rate right after it."""

    at: float
    share: float

    def share_at(self, now: float) -> float:
        """The share of the configured rate at ``now``: the cut's, climbed back since."""
        return min(1.0, self.share + _climb(self.share) * max(0.0, now - self.at))

    def whole_at(self) -> float:
        """When the key is back to its whole configured rate."""
        return self.at + (1.0 - self.share) / _climb(self.share)

    def encode(self) -> bytes:
        return f"{self.at!r} {self.share!r}".encode()


def _climb(share: float) -> float:
    return max(share / RECOVER, 1.0 / RISE)


def decode(raw: bytes | None) -> Cut | None:
    """The cut a record holds, or None (none, or one this version cannot read)."""
    if raw is None:
        return None
    try:
        at, share = map(float, bytes(raw).split())
    except ValueError:
        return None
    if not (math.isfinite(at) and 0.0 < share <= 1.0):
        return None
    return Cut(at, share)


def limit_at(limit: int, cut: Cut | None, now: float) -> int:
    """The tokens per period a limit of ``limit`` gives at ``now`` under ``cut``: at least 1."""
    if cut is None:
        return limit
    return max(1, int(limit * cut.share_at(now)))


def cut_name(key: str) -> str:
    """The name under which the broker keeps the cut of the rate limit ``key``."""
    return f"rate-cut:{key}"


def retry_delay(retry_after: float | None) -> float:
    """Seconds a throttled call is put back for."""
    if retry_after is not None:
        return retry_after
    return RETRY_AFTER * random.uniform(0.5, 1.5)


def http_429(err: BaseException) -> Throttle | None:
    """The ``Throttle`` an exception that carries an HTTP 429 stands for, with its response's
    ``Retry-After`` (seconds or a date), or None for any other exception. The status is read
    from ``err.response.status_code`` (requests, httpx), or ``status_code``, ``status`` or
    ``code`` of the exception or its response (urllib's ``HTTPError``, aiohttp)."""
    response = _attr(err, "response")
    status = None
    for holder in (response, err):
        if holder is None:
            continue
        for name in ("status_code", "status", "code"):
            value = _attr(holder, name)
            if type(value) is int:
                status = value
                break
        if status is not None:
            break
    if status != 429:
        return None
    headers = _attr(response, "headers") if response is not None else None
    if headers is None:
        headers = _attr(err, "headers")
    return Throttle(_retry_after(headers), f"HTTP 429 ({type(err).__name__})")


def _attr(obj: object, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that fails: as if it were not there
        return None


def _retry_after(headers: Any) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), or None."""
    try:
        text = str(headers.get("Retry-After")).strip() if headers is not None else "None"
    except Exception:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(text).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    return min(max(seconds, 0.0), 86400.0) if math.isfinite(seconds) else None


class CutStore(Protocol):
    """Where cuts are kept: a ``Broker``."""

    def get_rate_cuts(self, keys: Sequence[str]) -> list[bytes | None]: ...

    def put_rate_cuts(self, cuts: Sequence[tuple[str, bytes, float]]) -> None: ...


def cut(
    store: CutStore,
    requests: Sequence[tuple[str, float, int]],
    now: float,
    reads: Sequence[str] = (),
) -> list[Cut | None]:
    """For each ``(key, started, limit)``: cut the rate of ``key`` (configured at ``limit``
    tokens per period) by ``DECREASE``, unless its last cut was made after ``started`` (the
    wall time at which the throttled call began) or less than ``HOLD`` seconds ago. Returns
    each key's cut as it stands after, then the cut of each key of ``reads`` (None where
    none). One read and at most one write, whatever the number of keys."""
    if not requests and not reads:
        return []
    found = store.get_rate_cuts([*(key for key, _, _ in requests), *reads])
    out: list[Cut | None] = []
    writes: list[tuple[str, bytes, float]] = []
    for (key, started, limit), raw in zip(requests, found, strict=False):
        last = decode(raw)
        if last is not None and (started < last.at or now - last.at < HOLD):
            out.append(last)  # this call ran at the old rate: it says nothing of the new
            continue
        share = 1.0 if last is None else last.share_at(now)
        new = Cut(now, max(share * DECREASE, 1.0 / limit))
        out.append(new)
        writes.append((key, new.encode(), new.whole_at() - now + KEEP))
    if writes:
        store.put_rate_cuts(writes)
    out.extend(map(decode, found[len(requests) :]))
    return out
