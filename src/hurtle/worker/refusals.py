"""What the acker does with an outcome the broker refuses, or still cannot take when it stops.

An outcome the broker refuses for its own content (anything else: an ``EncodeError``, a script
error for that one delivery, ...) must not block the others. A refusal that is not a
``BrokerError`` is final at once; a ``BrokerError`` that is not about reaching the broker is given
``REFUSALS`` tries (the server may be briefly read-only or full). Then:

* a retry that cannot be scheduled goes to the dead letters instead, with the reason, after
  what ends with it (``Ends``: its result record, its workflow's, its unique lock; the acker's
  ``ends``, which the worker sets) is stored and released;
* a dead letter that cannot be stored, an acknowledgement or a hand-back that is refused, is
  logged as an ERROR and dropped from the acker: the delivery stays held by this worker and goes
  back to its queue when the session closes, so its task runs again (never lost, at worst run
  twice). Acknowledgements are tried one by one before any is dropped; so are workflow steps
  (``ack_flow``), whose next step is then set off by the run that follows.

Records with no delivery to acknowledge (``store_records``) are not outcomes: one the broker
refuses is logged and given up on, as the messages' fates are settled anyway.

An outcome the broker cannot be reached for is kept and tried again by the acker, ``stop``
included, until its timeout is spent; what is still unsettled then is logged as an error with the
counts (``give_up``). Such messages are not lost: they are still held by this worker's session in
the broker, which hands them back when the session closes (or, if it cannot be closed, once this
worker's heartbeat lapses), so their tasks run again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from ..brokers import Consumer, Delivery, FlowStep, Lock, StoredResult
from ..errors import BrokerError
from ..message import Message

log = logging.getLogger("hurtle.worker.acker")  # what operators see is the acker's doing

T = TypeVar("T")

#: What ends with a message that becomes a dead letter, given its delivery, the message and the
#: reason: ``(records to store first, unique lock to release)`` (``ends.ending``).
Ends = Callable[[Delivery, Message, str], tuple[list[StoredResult], Lock | None]]

#: Tries of an outcome that the reachable broker refuses before it is given up on.
REFUSALS = 3
#: Causes that mean "the broker cannot be reached now", whatever the driver (redis-py names its
#: own ``ConnectionError``/``TimeoutError``; sqlite3 says a busy or locked file this way).
_UNREACHABLE = frozenset({"ConnectionError", "TimeoutError", "OperationalError"})


def unreachable(err: BaseException) -> bool:
    """True when ``err`` says the broker cannot be reached now (retry), not that it refused."""
    if not isinstance(err, BrokerError):
        return False
    cause: BaseException | None = err.__cause__
    seen = 0
    while cause is not None and seen < 10:
        if isinstance(cause, OSError):
            return True
        if any(c.__name__ in _UNREACHABLE for c in type(cause).__mro__):
            return True
        cause = cause.__cause__
        seen += 1
    return False


class Op:
    """A retry, a dead letter, a deferral or a hand-back waiting to be settled."""

    __slots__ = ("arg", "deliveries", "kind", "refusals")

    def __init__(
        self, kind: str, deliveries: list[Delivery], arg: Message | str | float | None = None
    ) -> None:
        self.kind = kind  # "retry", "dead", "defer" or "release"
        self.deliveries = deliveries
        self.arg = arg
        self.refusals = 0

    def apply(self, consumer: Consumer) -> None:
        if self.kind == "retry":
            assert isinstance(self.arg, Message)
            consumer.retry(self.deliveries[0], self.arg)
        elif self.kind == "dead":
            assert isinstance(self.arg, str)
            consumer.dead_letter(self.deliveries[0], self.arg)
        elif self.kind == "defer":
            assert isinstance(self.arg, float)
            consumer.defer(self.deliveries[0], self.arg)
        else:
            consumer.release(self.deliveries)


class Verdict(NamedTuple):
    """What became of a refused outcome."""

    #: Off the acker's hands (settled another way, or given up on); False: try it again.
    done: bool
    settled: int = 0
    dropped: int = 0
    #: An outcome that replaces it, to settle once the broker can be reached again.
    later: Op | None = None


def refused(consumer: Consumer, op: Op, err: Exception, ends: Ends | None = None) -> Verdict:
    """Decide what becomes of ``op``, which the broker refused with ``err``; a retry that
    becomes a dead letter ends what ``ends`` says first."""
    op.refusals += 1
    if isinstance(err, BrokerError) and op.refusals < REFUSALS:
        log.warning(
            "the broker refused to settle one outcome (%s, try %d of %d): %s",
            op.kind,
            op.refusals,
            REFUSALS,
            err,
        )
        return Verdict(False)
    delivery = op.deliveries[0]
    if op.kind == "retry":
        assert isinstance(op.arg, Message)
        reason = (
            f"the broker refused to schedule the retry of this message ({err}); it is "
            f"kept here instead. The task had failed with: {op.arg.headers.get('error')}"
        )
        log.error(
            "could not schedule a retry of message %s of %r: %s; dead-lettering it",
            op.arg.id,
            delivery.queue,
            err,
        )
        dead = Op("dead", [delivery], reason)
        if ends is not None:
            _end(consumer, ends(delivery, op.arg, reason))
        try:
            dead.apply(consumer)
        except Exception as dead_err:
            if unreachable(dead_err):
                return Verdict(True, later=dead)
            err = dead_err
        else:
            return Verdict(True, settled=1)
    log.error(
        "the broker refused to settle %d deliveries of %r (%s: %s): giving up on them; they "
        "stay held by this worker and go back to their queue when it stops, so their tasks "
        "run again",
        len(op.deliveries),
        delivery.queue,
        "a dead letter"
        if op.kind in ("dead", "retry")
        else "a deferral"
        if op.kind == "defer"
        else "a hand-back",
        err,
    )
    return Verdict(True, dropped=len(op.deliveries))


def _end(consumer: Consumer, end: tuple[list[StoredResult], Lock | None]) -> None:
    """Store the records and release the lock that end with a dead letter, each at once (a
    rare road); one the broker refuses is logged, and the dead letter is recorded anyway."""
    records, lock = end
    try:
        if records:
            consumer.ack((), records)
        if lock is not None:
            consumer.release_unique([lock])
    except Exception as err:
        log.error(
            "could not store the records or release the lock of a dead letter (%s); the dead "
            "letter is kept all the same",
            err,
        )


def one_by_one(
    items: Sequence[T], settle: Callable[[T], None], what: Callable[[T], str]
) -> tuple[list[T], int, int]:
    """Settle each item alone with ``settle``, after a batch of them was refused: ``(those to
    try again, settled, dropped)``. A refused one is given up on, with an error naming it
    (``what``); the first that finds the broker unreachable leaves it and the rest for later."""
    settled = dropped = 0
    for i, item in enumerate(items):
        try:
            settle(item)
        except Exception as one_err:
            if unreachable(one_err):
                return list(items[i:]), settled, dropped
            dropped += 1
            log.error(
                "the broker refused to acknowledge %s (%s): giving up on it; it goes back to "
                "its queue when this worker stops, so its task runs again",
                what(item),
                one_err,
            )
        else:
            settled += 1
    return [], settled, dropped


def ack_one_by_one(
    consumer: Consumer, items: Sequence[tuple[Delivery, StoredResult | None]]
) -> tuple[list[tuple[Delivery, StoredResult | None]], int, int]:
    """``one_by_one`` for ``(delivery, its record or None)``: each acknowledged alone."""

    def settle(item: tuple[Delivery, StoredResult | None]) -> None:
        delivery, record = item
        if record is None:
            consumer.ack([delivery])
        else:
            consumer.ack([delivery], [record])

    def what(item: tuple[Delivery, StoredResult | None]) -> str:
        return f"a delivery of {item[0].queue!r}" + ("" if item[1] is None else " with its result")

    return one_by_one(items, settle, what)


def ack_flows_one_by_one(
    consumer: Consumer, steps: Sequence[FlowStep]
) -> tuple[list[FlowStep], int, int]:
    """``one_by_one`` for workflow members (``Consumer.ack_flow``)."""
    return one_by_one(
        steps,
        lambda step: consumer.ack_flow([step]),
        lambda step: f"a workflow step of {step.delivery.queue!r}",
    )


def acks_one_by_one(
    consumer: Consumer,
    acks: list[Delivery],
    with_results: list[tuple[Delivery, StoredResult]],
    err: Exception,
) -> tuple[list[Delivery], list[tuple[Delivery, StoredResult]], int, int]:
    """A batch of acknowledgements was refused with ``err``: find which, trying the plain ones
    one by one, then those that carry a result; ``(plain ones to try again, those with a result
    to try again, settled, dropped)``."""
    log.warning(
        "the broker refused %d acknowledgements (%s): trying them one by one", len(acks), err
    )
    again, settled, dropped = ack_one_by_one(consumer, [(d, None) for d in acks])
    again_results, settled_results, dropped_results = ack_one_by_one(consumer, with_results)
    return (
        [d for d, _ in again],
        [(d, r) for d, r in again_results if r is not None],
        settled + settled_results,
        dropped + dropped_results,
    )


def store_records(
    consumer: Consumer, records: list[StoredResult], note: str = ""
) -> Exception | None:
    """Store records that ride with no acknowledgement: the error when the broker cannot be
    reached (the caller keeps them for later), else None, stored or refused (logged, with
    ``note``, and given up on)."""
    try:
        consumer.ack((), records)
    except Exception as err:
        if unreachable(err):
            return err
        log.error("the broker refused to store %d results (%s)%s", len(records), err, note)
    return None


def give_up(acks: int, ops: Sequence[Op], defers: int, timeout: float) -> int:
    """Log what ``Acker.stop`` leaves unsettled once its ``timeout`` is spent (``acks``
    acknowledgements, ``ops``, ``defers`` deferrals); return how many outcomes it gives up on
    (deferrals are not counted: their deliveries go back with the session, like the rest)."""
    if defers:
        log.error(
            "could not defer %d throttled messages within the shutdown's %gs: they go "
            "back to their queues when this worker's session closes",
            defers,
            timeout,
        )
    if not acks and not ops:
        return 0
    kinds = {
        k: sum(len(o.deliveries) for o in ops if o.kind == k)
        for k in ("retry", "dead", "defer", "release")
    }
    log.error(
        "could not settle %d outcomes within the shutdown's %gs (%d acknowledgements, "
        "%d retries, %d dead letters, %d deferrals, %d hand-backs): those messages stay "
        "held by this worker in the broker and go back to their queues when its session "
        "closes or its heartbeat lapses, so their tasks run again",
        acks + sum(kinds.values()),
        timeout,
        acks,
        kinds["retry"],
        kinds["dead"],
        kinds["defer"],
        kinds["release"],
    )
    return acks + sum(kinds.values())
