"""``Tracker``: what a worker's running tasks report (``hurtle.current().progress``), written to
the broker at most once per interval, whatever the number of reports; and which of its running
tasks ``Hurtle.cancel`` named, learnt once per interval.

A report is kept in memory, the latest per message id (a dict store under a lock: a task that
reports in a tight loop costs no broker call per report). A thread of the tracker, started with
the first report, writes the reports gathered since its last write in one
``Broker.put_progress`` call every ``interval`` seconds (``hurtle.progress.INTERVAL``), and
once more when the worker stops; so a task's last report is written at the interval after it,
whether the task still runs or ended meanwhile. A worker whose tasks never report starts no
thread and makes no call. A write the broker refuses is logged and tried again at the next
interval with whatever is newer.

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
from collections.abc import Callable
from typing import Any

from ..brokers import Broker, Delivery, StoredResult
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
        # id() of a running delivery (or job) -> (it, fraction, message, when): ids are read
        # when the reports are written, off the tasks' path
        self._reports: dict[int, tuple[Any, float, str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        """Start the thread (the worker starts): it looks for cancelled running tasks."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="hurtle-tracker", daemon=True)
            self._thread.start()

    def report(self, running: Any, fraction: float, message: str) -> None:
        at = time.time()
        with self._lock:
            self._reports[id(running)] = (running, fraction, message, at)
            if self._thread is None:
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
        """Write the reports gathered since the last write, in one broker call."""
        with self._lock:
            reports, self._reports = self._reports, {}
        if not reports:
            return
        rows = [
            StoredResult(_id_of(item), encode_progress(Progress(f, m, at)), PROGRESS_TTL)
            for item, f, m, at in reports.values()
        ]
        try:
            self.broker.put_progress([r for r in rows if r.id])
        except Exception as err:  # kept for the next interval, unless a newer report came
            if not self._failing:
                log.warning("cannot store %d progress reports (%s): retrying", len(reports), err)
            self._failing = True
            with self._lock:
                for i, p in reports.items():
                    self._reports.setdefault(i, p)
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


def _id_of(item: Any) -> str:
    """The message id of a running delivery, or of a job's message."""
    return message_id(item.raw) if isinstance(item, Delivery) else str(item.message.id)
