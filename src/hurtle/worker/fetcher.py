"""``Fetcher``: pulls batches from the broker into a bounded local buffer.

The fetch loop asks the executor how much room it has, fetches at most that many deliveries, and
hands them over: the local buffer is the executor's, bounded by its capacity. A fetch that fails
(the broker went away) is logged and retried with backoff; the worker carries on. Every broker
call here is guarded so, the prefetch too: a broker restart never stops the loop.

When the executor runs a batch before ``submit`` returns (solo), the next fetch is sent to the
broker before the batch runs (``Consumer.prefetch``) and its reply read afterwards: the broker
works while the tasks do, with no extra thread. (A fetching thread was measured first and did not
pay: the threads fight over the GIL, and a stop must wait for the fetch in flight.) When
middleware read the broker before a batch runs (``debounce``'s latest records, a rate limit's
counts), the prefetch waits for those reads (``defer_prefetch``; the processor's
``before_calls`` sends it): sent first, it would run on the server in front of them, and the
batch would wait for the whole fetch script after all. A batch for which no such middleware
may read (``Middleware.reads_before_calls``: debounce while no call was replaced) is
prefetched at once. On a store that records
acknowledgements and claims in one step (SQLite, one writer at a time), the solo loop hands the
acknowledgements gathered so far to that step instead of leaving them to the acker's thread:
one transaction a batch instead of two that wait for each other. On a store whose prefetch
can carry them (Redis: the acknowledgement scripts sent in front of the fetch script), the
prefetch takes them along: no round trip of their own and no work on the acker's thread.
"""

from __future__ import annotations

import logging
import math
import threading
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING

from ..brokers import Consumer, Delivery, Ride
from ..errors import BrokerError
from ..middleware import Middleware, overrides
from . import rides
from .acker import Acker
from .executors import Executor

if TYPE_CHECKING:
    from .processor import Processor

log = logging.getLogger(__name__)


class Fetcher:
    def __init__(
        self,
        consumer: Consumer,
        executor: Executor,
        acker: Acker,
        wait: float,
        stopping: threading.Event,
        processor: Processor | None = None,
    ) -> None:
        self.consumer = consumer
        self.executor = executor
        self.acker = acker
        # solo on a store that records acks and claims in one step (SQLite): one transaction
        # a batch instead of two that contend for the one writer
        self.combine = executor.runs_in_submit and consumer.combines_ack_and_fetch
        # solo on a store whose prefetch can carry acknowledgements (Redis): each prefetch
        # takes the plain acknowledgements gathered so far with it, and the acker's thread
        # is no longer woken for them (it flushes what is left on its interval)
        self.rides = executor.runs_in_submit and not self.combine and consumer.acks_ride_prefetch
        if self.rides:
            consumer.unsettled_acks = partial(rides.give_back, acker)
            acker.wake_at = math.inf
        self.wait = wait
        self.failures = 0
        #: Whether the fetch of the last batch found cancellations live (``Consumer.
        #: cancellations``), read before the next fetch is sent.
        self.cancellations = False
        #: ``perf_counter()`` when the fetch of the last batch was sent (its prefetch, if it
        #: came from one): the broker read its cancellations flag after that.
        self.sent_at = 0.0
        self._prefetched_at: float | None = None
        #: When true, the next batch is not prefetched as soon as this one is fetched but by
        #: ``send_prefetch``, once the batch's middleware have read the broker: the solo
        #: ``processor``'s ``before_calls``, when its middleware decide before calls run.
        self.defer_prefetch = bool(
            executor.runs_in_submit and processor is not None and processor.decides_before_calls
        )
        #: The middleware that decide before calls run: asked per batch whether they read.
        self._deciders: list[Middleware] = []
        if self.defer_prefetch:
            assert processor is not None
            processor.before_calls = self.send_prefetch
            self._deciders = [m for m in processor.middleware if overrides(m, "before_batch")]
        self._prefetch_due = False
        self._stopping = stopping  # the worker's stop flag: it cuts a backoff wait short

    def fetch(self) -> list[Delivery] | None:
        """One batch, fetched here and now; ``None`` when there is no room or the fetch failed."""
        want = self.executor.wait_for_capacity(self.wait)
        if want <= 0:
            return None
        acks = self.acker.take_acks() if self.combine else None
        self._prefetch_due = False  # a batch that never got to its calls: a fetch here and now
        sent_at = self._prefetched_at
        self._prefetched_at = None
        if sent_at is None:
            sent_at = perf_counter()
        try:
            if acks:
                batch = self.consumer.ack_and_fetch(acks, want, self.wait)
            else:
                batch = self.consumer.fetch(want, self.wait)
        except BrokerError as err:
            if acks:
                self.acker.give_back(acks)
            self.failures += 1
            delay = min(0.1 * 2 ** min(self.failures, 6), 5.0)
            log.warning(
                "fetch failed (%d in a row), retrying in %.1fs: %s", self.failures, delay, err
            )
            self._stopping.wait(delay)
            return None
        if self.failures:
            log.info("broker reachable again after %d failed fetches", self.failures)
            self.failures = 0
        self.cancellations = bool(batch) and self.consumer.cancellations
        self.sent_at = sent_at
        if batch and self.executor.runs_in_submit:
            self._prefetch_due = True
            if not self.defer_prefetch or not any(m.reads_before_calls() for m in self._deciders):
                self.send_prefetch()
        return batch

    def send_prefetch(self) -> None:
        """Send the fetch of the next batch, if the last one fetched is owed one."""
        if not self._prefetch_due:
            return
        self._prefetch_due = False
        ride: Ride | None = None
        try:
            self._prefetched_at = perf_counter()
            if self.rides:
                ride = self.acker.take_ride()
                if self.consumer.prefetch_with_acks(self.executor.wait_for_capacity(0), ride):
                    ride = None  # the consumer's now: recorded, or handed back
            else:
                self.consumer.prefetch(self.executor.wait_for_capacity(0))
        except BrokerError as err:  # the batch in hand runs; the next fetch tries again
            log.debug("prefetch failed: %s", err)
        finally:
            if ride is not None:
                rides.give_back(self.acker, ride)
