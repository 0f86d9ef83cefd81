"""``Tracker``: what a worker's running tasks report (``hurtle.current().progress``), written to
the broker at most once per interval, whatever the number of reports; and which of its running
tasks ``Hurtle.cancel`` named, learnt once per interval.

A report is kept on the task's context (``hurtle.context.Current``), which is handed to the
tracker (``report``: a deque append) on its first report since its last write: a task that
reports in a tight loop costs a tuple and an attribute store per report, and no lock, clock
read or broker call. A thread of the tracker, started with the worker (or with the first report),
writes the latest report of every context handed to it since its last write in one
``Broker.put_progress`` call every ``interval`` seconds (``hurtle.progress.INTERVAL``), and once
more when the worker stops; so a task's last report is written at the interval after it,
whether the task still runs or ended meanwhile. A report's ``at`` is the time of that write (at
most an interval after the report), and reports that are equal are encoded once per write. A
worker whose tasks never report makes no call. A write the broker refuses is logged and tried
again at the next interval with whatever is newer.

Cancels. The same thread, started with the worker, looks at what the executor runs each
interval (``Executor.running_items``, a snapshot); the deliveries it saw run at the previous look
too (they ran through a whole interval) are checked with one ``Broker.cancelled`` call. A task
that ends within an interval is never asked about: a worker of short tasks makes no call. The
cancelled ids go in ``cancelled``, which ``hurtle.current().cancelled`` and the processor read
(their calls are recorded ``cancelled``, whatever they return), and the executor is told
(``Executor.cancel_running``) to stop them where its pool can. So a running task learns of its
cancellation within two intervals (a second).

Under gevent or eventlet the thread is a greenlet (the process is patched), and writes through
the broker's connections as the worker's other greenlets do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..brokers import Broker, Delivery, StoredResult
from ..context import Current
from ..message import message_id
from ..progress import INTERVAL, PROGRESS_TTL, Progress, encode_progress

log = logging.getLogger(__name__)


class Tracker:
    def __init__(
        self,
        broker: Broker,
        interval: float = INTERVAL,
        *,
        running: Callable[[], list[Any]] | None = None,
        on_cancel: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self.broker = broker
        self.interval = interval
        #: What runs now (``Executor.running_items``), and what stops cancelled items.
        self._running = running
        self._on_cancel = on_cancel
        #: Broker calls that asked about cancellations (for tests and the benchmarks).
        self.polls = 0
        #: Ids of running messages that were cancelled (``hurtle.current().cancelled``).
        self.cancelled: set[str] = set()
        #: Broker calls that stored reports (for tests and the benchmarks).
        self.writes = 0
        # the contexts that reported since the last write: appended by the tasks (once per
        # write), taken from the left by ``flush``; ids are read then, off the tasks' path
        self._reported: deque[Current] = deque()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        #: What ``Current.progress`` calls on a context's first report since its last write:
        #: the deque's own ``append`` once the thread runs (a C call, no Python frame).
        self.report: Callable[[Current], None] = self._report_and_start

    def start(self) -> None:
        """Start the thread (the worker starts): it looks for cancelled running tasks."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="hurtle-tracker", daemon=True)
            self._thread.start()
            self.report = self._reported.append

    def _report_and_start(self, context: Current) -> None:
        """``report`` before the thread runs: write the latest report of ``context`` at the
        next interval, and start the thread that writes it."""
        self._reported.append(context)
        with self._lock:
            self._start()

    def _run(self) -> None:
        seen: dict[int, Any] = {}
        while not self._stop.wait(self.interval):
            self.flush()
            if self._running is not None:
                try:
                    seen = self._poll(seen)
                except Exception:  # never let the thread die: the next look tries again
                    log.exception("could not look for cancelled running tasks")

    def _poll(self, seen: dict[int, Any]) -> dict[int, Any]:
        """Ask about the items that ran at the last look and still run; returns what runs."""
        assert self._running is not None
        now = {id(item): item for item in self._running()}
        held = [item for key, item in now.items() if seen.get(key) is item]
        if not held:
            return now
        ids = [_id_of(item) for item in held]
        asked = [i for i in ids if i and i not in self.cancelled]
        if not asked:
            return now
        try:
            gone = self.broker.cancelled(asked)
        except Exception as err:
            log.warning("cannot read which running tasks are cancelled (%s): asking again", err)
            return now
        self.polls += 1
        fresh = [item for item, i in zip(held, ids, strict=True) if i in gone]
        if fresh:
            # ids leave the set when their calls are recorded ``cancelled`` (the processor)
            self.cancelled.update(i for i in ids if i in gone)
            log.info("%d running tasks were cancelled: telling them", len(fresh))
            if self._on_cancel is not None:
                self._on_cancel(fresh)
        return now

    def flush(self) -> None:
        """Write the latest report of each context handed in since the last write, in one
        broker call."""
        with self._flushing:
            reported = self._reported
            taken = [reported.popleft() for _ in range(len(reported))]
            if not taken:
                return
            at = time.time()
            encoded: dict[tuple[float, str], bytes] = {}
            latest: dict[str, bytes] = {}  # by message id: a context handed in twice counts once
            for context in taken:
                report = context.take_report()
                payload = encoded.get(report)
                if payload is None:
                    payload = encoded[report] = encode_progress(Progress(*report, at))
                latest[context.id] = payload
            try:
                self.broker.put_progress(
                    [StoredResult(i, p, PROGRESS_TTL) for i, p in latest.items() if i]
                )
            except Exception as err:  # written at the next interval, with whatever is newer
                if not self._failing:
                    log.warning("cannot store %d progress reports (%s): retrying", len(latest), err)
                self._failing = True
                for context in taken:
                    context.keep_report()
                return
            self._failing = False
            self.writes += 1

    def close(self) -> None:
        """Stop the thread and write what is left (the worker stops)."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(self.interval + 5)
        self.flush()
        self._reported.clear()  # what the last write could not store: let go of it


def _id_of(item: Any) -> str:
    """The message id of a running delivery, or of a job's message."""
    return message_id(item.raw) if isinstance(item, Delivery) else str(item.message.id)
