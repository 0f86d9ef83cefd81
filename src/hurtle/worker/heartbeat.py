"""``Heartbeat``: tells the broker this worker lives, and so recovers what dead workers held.

It runs on its own thread at a fraction of ``heartbeat_timeout``, so a long task never makes its
worker look dead. A failed beat is logged and tried again at the next tick.
"""

from __future__ import annotations

import logging
import threading

from ..brokers import Consumer

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, consumer: Consumer, interval: float) -> None:
        self.consumer = consumer
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hurtle-heartbeat", daemon=True)
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def beat(self) -> bool:
        try:
            self.consumer.heartbeat()
        except Exception as err:
            self.failures += 1
            log.warning("heartbeat failed (%d in a row): %s", self.failures, err)
            return False
        if self.failures:
            log.info("heartbeat restored after %d failures", self.failures)
        self.failures = 0
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval + 5)
