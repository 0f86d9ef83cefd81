"""``Tracker``: what a worker's running tasks report (``hurtle.current().progress``), written to
the broker at most once per interval, whatever the number of reports.

A report is kept in memory, the latest per message id (a dict store under a lock: a task that
reports in a tight loop costs no broker call per report). A thread of the tracker, started with
the first report, writes the reports gathered since its last write in one
``Broker.put_progress`` call every ``interval`` seconds (``hurtle.progress.INTERVAL``), and
once more when the worker stops; so a task's last report is written at the interval after it,
whether the task still runs or ended meanwhile. A worker whose tasks never report starts no
thread and makes no call. A write the broker refuses is logged and tried again at the next
interval with whatever is newer.

Under gevent or eventlet the thread is a greenlet (the process is patched), and writes through
the broker's connections as the worker's other greenlets do.
"""

from __future__ import annotations

import logging
import threading

from ..brokers import Broker, StoredResult
from ..progress import INTERVAL, PROGRESS_TTL, Progress, encode_progress

log = logging.getLogger(__name__)


class Tracker:
    def __init__(self, broker: Broker, interval: float = INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        #: Ids of running messages that were cancelled (``hurtle.current().cancelled``).
        self.cancelled: set[str] = set()
        #: Broker calls that stored reports (for tests and the benchmarks).
        self.writes = 0
        self._reports: dict[str, Progress] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def report(self, message_id: str, progress: Progress) -> None:
        with self._lock:
            self._reports[message_id] = progress
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="hurtle-progress", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        """Write the reports gathered since the last write, in one broker call."""
        with self._lock:
            reports, self._reports = self._reports, {}
        if not reports:
            return
        try:
            self.broker.put_progress(
                [StoredResult(i, encode_progress(p), PROGRESS_TTL) for i, p in reports.items()]
            )
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
