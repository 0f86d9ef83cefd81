"""``Acker``: gathers the outcomes of processed deliveries and settles them in batches.

Acknowledgements are flushed in one broker call every ``batch_size`` outcomes or every
``interval`` seconds, whichever comes first, from the acker's own thread, so executors never wait
on the network to finish a task. Retries and dead letters (rare) go through the same thread, in
order. When the broker is unreachable, outcomes are kept and retried with backoff, never dropped.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from ..brokers import Consumer, Delivery
from ..message import Message

log = logging.getLogger(__name__)

_Op = Callable[[Consumer], None]


class Acker:
    def __init__(self, consumer: Consumer, *, batch_size: int = 1000, interval: float = 0.005
                 ) -> None:
        self.consumer = consumer
        self.batch_size = batch_size
        self.interval = interval
        self._lock = threading.Lock()  # guards _ops
        self._flushing = threading.Lock()  # one flush at a time
        # appended to by executor threads without a lock (deque.append is atomic), drained by
        # whoever flushes: the hot path pays one append and one length check per task
        self._acks: deque[Delivery] = deque()
        self._ops: list[_Op] = []
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="hurtle-acker", daemon=True)
        #: Outcomes settled so far (acks, retries, dead letters).
        self.settled = 0

    def start(self) -> None:
        self._thread.start()

    def ack(self, delivery: Delivery) -> None:
        acks = self._acks
        acks.append(delivery)
        if len(acks) == self.batch_size:
            self._wake.set()

    def ack_many(self, deliveries: list[Delivery]) -> None:
        acks = self._acks
        acks.extend(deliveries)
        if len(acks) >= self.batch_size:
            self._wake.set()

    def take_acks(self) -> list[Delivery]:
        """Take the acknowledgements gathered so far, for the caller to record itself."""
        with self._flushing:
            pending = self._acks
            popleft = pending.popleft
            return [popleft() for _ in range(len(pending))]

    def give_back(self, acks: list[Delivery]) -> None:
        """Return acknowledgements taken with ``take_acks`` that could not be recorded."""
        self._acks.extendleft(reversed(acks))

    def retry(self, delivery: Delivery, message: Message) -> None:
        self._op(lambda c: c.retry(delivery, message))

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._op(lambda c: c.dead_letter(delivery, reason))

    def release(self, deliveries: list[Delivery]) -> None:
        if deliveries:
            self._op(lambda c: c.release(deliveries))

    def _op(self, op: _Op) -> None:
        with self._lock:
            self._ops.append(op)
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._acks) + len(self._ops)

    def flush(self) -> bool:
        """Settle everything gathered so far, now, from the calling thread; False on failure."""
        with self._flushing:
            return self._flush()

    def _flush(self) -> bool:
        with self._lock:
            ops, self._ops = self._ops, []
        pending = self._acks
        popleft = pending.popleft
        acks = [popleft() for _ in range(len(pending))]
        done_ops = 0
        try:
            for op in ops:
                op(self.consumer)
                done_ops += 1
            if acks:
                self.consumer.ack(acks)
        except Exception as err:
            log.warning("could not settle %d outcomes, will retry: %s",
                        len(acks) + len(ops) - done_ops, err)
            with self._lock:  # put back in front, in order
                self._ops[:0] = ops[done_ops:]
            pending.extendleft(reversed(acks))
            return False
        self.settled += len(acks) + len(ops)
        return True

    def _run(self) -> None:
        backoff = self.interval
        while True:
            self._wake.wait(backoff)
            self._wake.clear()
            stopping = self._stopping
            if self.flush():
                backoff = self.interval
            else:
                backoff = min(max(backoff * 2, 0.05), 2.0)
            if stopping:
                return

    def stop(self, timeout: float = 10.0) -> None:
        """Flush what is left and stop the thread (retrying the broker for up to ``timeout``)."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.pending:
            self.flush()
