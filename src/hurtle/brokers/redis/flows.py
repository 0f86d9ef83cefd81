"""Workflows on Redis: ``ack_flow`` as one ``ack_flow.lua`` call per step, every step of a batch
in one round trip, and the chord records (one hash per chord) that script keeps.

Each step is one script, so it is atomic: the acknowledgement, the results, the next link, the
chord count and the callback happen together or not at all. The chord's hash holds a field per
member index (``HSETNX``: a member counted twice counts once) and ``fired`` once the callback is
out; the member whose field makes ``total`` publishes the callback. ``chord_results`` reads the
members' results with one ``HMGET``. The keys of one step span hash tags (the worker's queue,
the next link's queue, the chord): this runs on one Redis server; on a
Redis Cluster, ``cluster.py`` splits a batch of steps into per-slot round trips.
"""

from __future__ import annotations

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


def _step_call(consumer: Any, step: FlowStep) -> tuple[list[str | bytes], list[Any]]:
    d = step.delivery
    keys: list[str | bytes] = [consumer._target(d.queue).inflight, QUEUES]
    args: list[Any] = [
        d.receipt >> BATCH_BITS,
        d.receipt & BATCH_MASK,
        len(step.results),
        len(step.publish),
        1 if step.chord is not None else 0,
        1 if step.forget else 0,
        RESULTS_CHANNEL,
        " ".join(r.id for r in step.results),
    ]
    for r in step.results:
        keys.append(result_key(r.id))
        args += [r.id, r.payload, max(int(r.ttl * 1000), 1)]
    for m in step.publish:
        keys += _publish_keys(m.queue)
        args += _message_args(m)
    chord = step.chord
    if chord is not None:
        keys.append(chord_key(chord.id))
        keys += _publish_keys(chord.callback.queue)
        args += [chord.index, chord.total, chord.payload, max(int(chord.ttl * 1000), 1)]
        args += _message_args(chord.callback)
    if step.forget:
        keys.append(chord_key(step.forget))
    return keys, args


def ack_flow(consumer: Any, steps: Sequence[FlowStep]) -> None:
    """``Consumer.ack_flow`` for ``RedisConsumer``: one script per step, one round trip."""
    check_steps(steps)
    if not steps:
        return
    b = consumer.broker
    script = b._scripts.ack_flow
    commands = [b._call(script, *_step_call(consumer, step)) for step in steps]
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
