"""``OutboxRelay``: runs the outbox's relay (``brokers.postgres.relay``) inside every worker of an
app with an outbox (``outbox=``), on a thread of its own.

Every worker offers: the relays wait for one lock in the outbox's database, so one of them moves
the outbox at a time, and another takes over when that worker stops or dies. A worker that
cannot reach the outbox's database keeps consuming (the relay logs and tries again).
"""

from __future__ import annotations

import threading

from . import Middleware, WorkerParts


class OutboxRelay(Middleware):
    """The relay's thread, started with the worker and stopped with it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The relay this worker runs (``brokers.postgres.relay.Relay``), once started.
        self.relay: object = None

    def worker_start(self, worker: WorkerParts) -> None:
        from ..brokers.postgres.relay import Relay

        table = worker.app.outbox
        if table is None:
            return
        relay = self.relay = Relay(table, worker.app.broker)
        self._stop.clear()
        self._thread = threading.Thread(
            target=relay.run, args=(self._stop,), name="hurtle-outbox-relay", daemon=True
        )
        self._thread.start()

    def worker_stop(self, worker: WorkerParts) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
