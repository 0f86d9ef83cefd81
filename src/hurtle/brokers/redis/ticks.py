"""Tick claims (``Broker.claim_tick``): ``claim_tick.lua`` records a schedule's tick among its
latest claimed ones, judges it by the server's clock, and publishes its messages (taking their
unique locks for a ``unique_for`` task) in one step under the queue's hash tag; ``last_tick``
reads the record."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis

from ...message import Message
from ..keys import QUEUES, queue_keys
from ..ticks import RECENT_TICKS, TAKEN, TICK_SKEW, WON, TickBatch, TickClaim
from .scripts import (
    _PRIORITIES,
    _PRIORITY_ARG,
    _Command,
    _lock_end,
    _publish_keys,
    _ScriptRunner,
    _Scripts,
)


class _Ticks(_ScriptRunner):
    """``RedisBroker``'s side of periodic tasks."""

    _scripts: _Scripts

    if TYPE_CHECKING:  # RedisBroker's

        def _publishing(self, commands: list[_Command], doing: str) -> list[Any]: ...

    def _store_tick(self, batch: TickBatch) -> TickClaim:
        queue, name, tick, messages = batch.queue, batch.name, batch.tick, list(batch.messages)
        k = queue_keys(queue)
        redis_keys = (k.schedule(name), k.schedule_ticks(name), *_publish_keys(queue))
        args: list[Any] = [repr(float(tick)), repr(TICK_SKEW), RECENT_TICKS]
        if batch.keys is None or batch.unique_for is None:
            args += ["p", *_publish_args(messages, batch.payloads)]
        else:
            redis_keys += (k.unique, k.unique_sweep)
            args += ["u", *_unique_args(messages, batch.payloads, batch.keys, batch.unique_for)]
        script = self._call(self._scripts.claim_tick, redis_keys, args)
        _, (status, detail) = self._publishing(
            [(("SADD", QUEUES, queue), None), script],
            f"claiming tick {tick!r} of schedule {name!r}",
        )
        if status == 0:
            return TAKEN
        if status < 0:
            return TickClaim(False, early=tick - float(detail))
        if not detail:
            return WON
        holder = detail[1]
        return TickClaim(True, held_by=holder.decode() if isinstance(holder, bytes) else holder)

    def last_tick(self, queue: str, name: str) -> float | None:
        try:
            raw = self._client.get(queue_keys(queue).schedule(name))
        except redis.RedisError as err:
            self._fail(err, f"reading the last tick of schedule {name!r}")
        return None if raw is None else float(raw)


def _publish_args(messages: list[Message], payloads: list[bytes]) -> list[Any]:
    """``publish.lua``'s ARGV for messages of one queue: ready ones by priority, then delayed."""
    now = time.time()
    ready: dict[int, list[bytes]] = {p: [] for p in _PRIORITIES}
    delayed: list[Any] = []
    for m, raw in zip(messages, payloads, strict=True):
        if m.eta > now:
            delayed.extend((m.eta, _PRIORITY_ARG[m.priority], raw))
        else:
            ready[m.priority].append(raw)
    args: list[Any] = [len(ready[p]) for p in _PRIORITIES]
    for p in _PRIORITIES:
        args += ready[p]
    return args + delayed


def _unique_args(
    messages: list[Message], payloads: list[bytes], keys: list[str], unique_for: float
) -> list[Any]:
    """``claim_tick.lua``'s ARGV after 'u': the number of groups of one (priority, eta), then
    per group its size and ``publish_unique.lua``'s ARGV."""
    groups: dict[tuple[int, float], list[Any]] = {}
    for m, raw, key in zip(messages, payloads, keys, strict=True):
        group = groups.get((m.priority, m.eta))
        if group is None:
            group = groups[(m.priority, m.eta)] = [
                0,
                repr(float(unique_for)),
                _PRIORITY_ARG[m.priority],
                repr(float(m.eta)),
            ]
        group[0] += 1
        group.extend((key, m.id, raw, _lock_end(m)))
    args: list[Any] = [len(groups)]
    for group in groups.values():
        args += group
    return args
