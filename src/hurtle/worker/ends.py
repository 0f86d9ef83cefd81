"""What a message ends when the worker makes it a dead letter: decided here, for every road.

A worker dead-letters a message by many roads: it failed for good (retries spent, ``Reject``, a
time limit, arguments that do not fit), it expired or was cancelled before it started, its task
is unknown to this worker, its bytes do not decode, its handling crashed, or the broker refused
to schedule its retry. Whatever the road, three things may wait on that message, and ``ending``
says how each ends:

* its result record — for a task that keeps results (``store_result``), or one this worker does
  not know (its sender may keep them): ``dead``, ``expired`` or ``cancelled``, so that its handle
  raises ``TaskFailed`` at once instead of reading ``pending`` for ever;
* its workflow — a chain link, group or chord member, chord callback: the same state recorded
  under the workflow's id, naming the member, so that the workflow's handle raises at once and
  what would have come after it never runs;
* its unique lock, when it names one: the same call sent again runs.

The worker hands the records to the acker before the dead letter (a record never lands after
the outcome) and the lock with it. A message the broker dead-letters itself (its workers kept
dying) ends the same three things in the broker's own step (``brokers.common.dead_ends``).

Each road is rare: this costs nothing to messages that run and are acknowledged.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, NamedTuple

from ..brokers import Lock, StoredResult
from ..flow import FLOW, read_flow
from ..message import Message, lock_of
from ..middleware.results import encode_failure
from ..records import DEAD, encode_skipped, member_record

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..middleware import Job


class Ending(NamedTuple):
    """What ends with a dead letter: the records to store first, the lock to release."""

    records: list[StoredResult]
    lock: Lock | None


def ending(
    app: Hurtle,
    queue: str,
    message: Message,
    why: str,
    *,
    state: str = DEAD,
    error: BaseException | None = None,
    job: Job | None = None,
) -> Ending:
    """What ends with ``message`` of ``queue``, dead-lettered because ``why`` (the record's
    text when there is no ``error``): its workflow's record, its own record (``state``) when its
    task keeps results or is unknown here, and its unique lock."""
    task = app.tasks.get(message.task)
    ttl = task.result_ttl if task is not None else app.settings.result_ttl
    records: list[StoredResult] = []
    flow_id = ""
    if message.headers and FLOW in message.headers:
        with contextlib.suppress(Exception):  # a header that is no workflow's: none to end
            flow_id = read_flow(message).id
        if flow_id:
            records.append(StoredResult(flow_id, member_record(state, message, error, why), ttl))
    if message.id != flow_id and (task is None or task.store_result):
        if error is not None:
            payload = encode_failure(state, error, job, app.broker.max_result_size)
        else:
            payload = encode_skipped(state, why, message)
        records.append(StoredResult(message.id, payload, ttl))
    lock = lock_of(message)
    return Ending(records, None if lock is None else (queue, lock[0], message.id, lock[1]))
