"""Workflows on Redis: ``ack_flow`` as one ``ack_flow.lua`` call per batch of steps (up to
``STEPS_PER_CALL``; a larger batch's calls go in one round trip), and the chord records (one
hash per chord) that script keeps.

A script is atomic, so each step is: the acknowledgement, the results, the next link, the chord
count and the callback happen together or not at all. The call names each key once, and a
chord's callback (the same for all its members) once. The chord's hash holds a field per
member index (``HSETNX``: a member counted twice counts once) and ``fired`` once the callback is
out; the member whose field makes ``total`` publishes the callback. ``chord_results`` reads the
members' results with one ``HMGET``. The keys of one step span hash tags (the worker's queue,
the next link's queue, the chord): this runs on one Redis server; on a
Redis Cluster, ``cluster.py`` splits a batch of steps into per-slot round trips.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

import redis

from ...message import MAX_PRIORITY, Message
from ..common import LOST_TTL, check_steps
from ..keys import (
    BATCH_BITS,
    BATCH_MASK,
    QUEUES,
    RESULT_BUCKET_CUT,
    RESULT_KEY_PREFIX,
    RESULTS_CHANNEL,
    chord_key,
    result_key,
)
from ..records import FlowStep
from .scripts import _publish_keys

#: The extra ``heartbeat.lua`` arguments with which a message it dead-letters gets its records
#: (its own, its workflow's).
HEARTBEAT_FLOW_ARGS = (
    RESULT_KEY_PREFIX,
    int(LOST_TTL * 1000),
    RESULTS_CHANNEL,
    RESULT_BUCKET_CUT,
)


def _message_args(m: Message) -> list[Any]:
    eta = m.eta if m.eta > time.time() else 0
    return [m.queue, str(min(max(m.priority, 0), MAX_PRIORITY)), repr(float(eta)), m.encode()]


#: Steps per ``ack_flow.lua`` call: a batch's calls go in one round trip, and no one call holds
#: the server for long.
STEPS_PER_CALL = 64


#: A step's small numbers, and a chord member's, packed as ``ack_flow.lua`` unpacks them: one
#: argument where each would be one (redis-py packs every argument in Python).
_PACK6 = struct.Struct("<6I").pack
_PACK4 = struct.Struct("<4I").pack


class _Call:
    """The keys and arguments of one ``ack_flow.lua`` call, each key named once."""

    def __init__(self) -> None:
        self.keys: list[str | bytes] = [QUEUES]
        self.positions: dict[str | bytes, int] = {}
        self.queues: dict[str, int] = {}  # by queue: the position of its first key
        self.callbacks: list[Any] = []
        self.numbers: dict[int, int] = {}  # by callback message: its number (from 1)
        self.steps: list[Any] = []

    def key(self, name: str | bytes) -> int:
        at = self.positions.get(name)
        if at is None:
            self.keys.append(name)
            at = self.positions[name] = len(self.keys)
        return at

    def queue(self, name: str) -> int:
        """The position of the first of ``name``'s 13 keys (named together, in a row)."""
        at = self.queues.get(name)
        if at is None:
            keys = _publish_keys(name)
            at = self.queues[name] = len(self.keys) + 1
            self.keys += keys
            for i, k in enumerate(keys):
                self.positions[k] = at + i
        return at

    def message(self, m: Message) -> list[Any]:
        return [self.queue(m.queue), *_message_args(m)]

    def add(self, consumer: Any, step: FlowStep) -> None:
        d = step.delivery
        chord = step.chord
        head = _PACK6(
            self.key(consumer._target(d.queue).inflight),
            d.receipt & BATCH_MASK,
            len(step.results),
            len(step.publish),
            0 if chord is None else 1,
            self.key(chord_key(step.forget)) if step.forget else 0,
        )
        args = self.steps
        args += [head, d.receipt >> BATCH_BITS, " ".join(r.id for r in step.results)]
        for r in step.results:
            args += [self.key(result_key(r.id)), r.id, r.payload, max(int(r.ttl * 1000), 1)]
        for m in step.publish:
            args += self.message(m)
        if chord is not None:
            c = chord.callback
            number = self.numbers.get(id(c))
            if number is None:  # the same for all the chord's members: passed once
                self.callbacks += self.message(c)
                number = self.numbers[id(c)] = len(self.numbers) + 1
            at = self.key(chord_key(chord.id))
            args.append(_PACK4(at, chord.index, chord.total, number))
            args += [chord.payload, max(int(chord.ttl * 1000), 1)]

    def args(self, steps: int) -> list[Any]:
        return [RESULTS_CHANNEL, steps, len(self.numbers), *self.callbacks, *self.steps]


def ack_flow(consumer: Any, steps: Sequence[FlowStep]) -> None:
    """``Consumer.ack_flow`` for ``RedisConsumer``: one script per ``STEPS_PER_CALL`` steps,
    all in one round trip."""
    check_steps(steps)
    if not steps:
        return
    b = consumer.broker
    script = b._scripts.ack_flow
    commands = []
    for at in range(0, len(steps), STEPS_PER_CALL):
        part = steps[at : at + STEPS_PER_CALL]
        call = _Call()
        for step in part:
            call.add(consumer, step)
        commands.append(b._call(script, call.keys, call.args(len(part))))
    b._pipeline(commands, f"acknowledging {len(steps)} workflow steps")


def chord_results(broker: Any, id: str, total: int) -> list[bytes] | None:
    """``Broker.chord_results`` for ``RedisBroker``: one ``HMGET`` of every member."""
    if total <= 0:
        return []
    try:
        values: list[Any] = broker._results.execute_command("HMGET", chord_key(id), *range(total))
    except redis.RedisError as err:
        broker._fail(err, f"reading the results of chord {id}")
    if any(v is None for v in values):
        return None
    return [bytes(v) for v in values]
