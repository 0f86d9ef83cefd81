"""``Screen``: cancellations recorded after a delivery was fetched, before its task starts.

A fetch says whether cancellations are live, and only then is its batch screened, with one
``Broker.cancelled`` call (``Worker._screen``). A delivery may then wait in the worker before
its task starts: the rest of a solo batch of slow tasks, the batch prefetched for after it, the
buffer of a pool. A cancellation recorded meanwhile would be missed. So the worker keeps one
bound for every delivery it holds unstarted, ``fresh_until``: ``WINDOW`` seconds after the
moment the broker state they were all checked against was read (the fetch that brought them
was sent, or the last re-screen). A task about to start past that bound first re-screens every
unstarted delivery the executor holds, with one ``Broker.cancelled`` call, whatever the last
fetch said; the cancelled ones are recorded as such (``Processor.cancelled``) and skipped when
their turn comes. Starting tasks check one float per task (the loops read the clock anyway);
a batch that starts all its tasks within ``WINDOW`` of its fetch makes no call at all.

``Hurtle.cancel`` returns ``WINDOW`` (and a margin: ``hurtle.cancels``) after the cancellation
is recorded: any task that starts after that was checked against a state read after the
cancellation, so a message not started when ``cancel`` returned never runs.

Reads of the bound and the skip set from task loops take no lock: a float and a set read under
the GIL. ``fetched`` and ``ensure`` take ``lock``; a fetch noted while a re-screen waits on the
broker keeps the older bound (``_generation``), so a delivery the re-screen did not see is
never counted as checked.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from time import perf_counter

from ..brokers import Broker, Delivery
from ..cancels import WINDOW
from ..errors import BrokerError
from ..message import message_id

log = logging.getLogger(__name__)


class Screen:
    def __init__(
        self,
        broker: Broker,
        unstarted: Callable[[], list[Delivery]],
        cancelled: Callable[[list[Delivery]], None],
    ) -> None:
        self._broker = broker
        #: The deliveries the executor holds and has not started (a snapshot).
        self._unstarted = unstarted
        #: Records deliveries found cancelled (``Processor.cancelled``).
        self._cancelled = cancelled
        self.lock = threading.RLock()
        #: ``perf_counter()`` past which an unstarted delivery must be screened again.
        self.fresh_until = math.inf
        #: ``id()`` of the unstarted deliveries found cancelled: skipped when taken.
        self.skip: set[int] = set()
        self._generation = 0
        self._failing = False  # the last re-screen could not reach the broker

    def fetched(self, sent_at: float, alone: bool) -> None:
        """A batch whose fetch was sent at ``sent_at`` (``perf_counter``) is now held by the
        executor; ``alone`` when it holds nothing else unstarted (solo, between batches)."""
        with self.lock:
            self._generation += 1
            if alone:
                self.fresh_until = sent_at + WINDOW
                self.skip.clear()  # whatever was left in it was handed back
            else:
                self.fresh_until = min(self.fresh_until, sent_at + WINDOW)

    def taken(self, delivery: Delivery) -> bool:
        """True when ``delivery`` was found cancelled (its outcome is recorded): skip it."""
        skip = self.skip
        if skip and id(delivery) in skip:
            skip.discard(id(delivery))
            return True
        return False

    def ensure(self, now: float, starting: Delivery) -> float:
        """Re-screen every unstarted delivery, ``starting`` (taken from the executor's buffer
        to start now) among them, when ``now`` is past the bound; the new bound.

        While the broker cannot be reached, the deliveries in hand start unchecked (the worker
        rides out an outage as it did before: no cancellation can be recorded meanwhile, only
        one recorded in the moments before it would be missed), and the next check is tried
        ``WINDOW`` later."""
        with self.lock:
            if now <= self.fresh_until:
                return self.fresh_until
            generation = self._generation
            held = [starting, *(d for d in self._unstarted() if id(d) not in self.skip)]
            at = perf_counter()
            try:
                gone = self._check(held)
            except BrokerError as err:
                if not self._failing:
                    log.warning(
                        "cannot check %d waiting deliveries for cancellations (%s): starting "
                        "them unchecked until the broker answers",
                        len(held),
                        err,
                    )
                self._failing = True
                self.fresh_until = perf_counter() + WINDOW
                return self.fresh_until
            if self._failing:
                log.info("checking waiting deliveries for cancellations again")
                self._failing = False
            if gone:
                self.skip.update(id(d) for d in gone)
                self._cancelled(gone)
            bound = at + WINDOW
            # a batch noted meanwhile may be older than this read: keep its bound
            self.fresh_until = (
                bound if generation == self._generation else min(bound, self.fresh_until)
            )
            return self.fresh_until

    def _check(self, held: list[Delivery]) -> list[Delivery]:
        if not held or not self._broker.cancellations_live():  # most often: nothing per id
            return []
        ids = [message_id(d.raw) for d in held]
        gone = self._broker.cancelled([i for i in ids if i])
        if not gone:
            return []
        return [d for d, i in zip(held, ids, strict=True) if i in gone]
