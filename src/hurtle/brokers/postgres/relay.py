"""The outbox's relay: moves committed rows of the outbox table (``outbox.py``) to the broker, in
batches, and deletes them.

One relay works at a time per outbox: it holds a session advisory lock
(``pg_try_advisory_lock``) on its own connection for as long as it relays. Every worker of an
app with an outbox runs one (``middleware.relay``), and so does ``hurtle outbox relay APP``; the
others wait, trying the lock again every ``poll_interval``, and one of them takes over as soon as
the relay at work stops or dies (PostgreSQL ends a dead client's session, and its lock with it).

The loop: in one transaction, delete the oldest rows, those that start within the first
``RELAY_BATCH`` messages, returning them (one statement); publish them with
``Broker.publish_once``; commit. Again at once while batches come full, else wait for a
notification (each write notifies the outbox's channel at its commit: ``LISTEN``) or
``poll_interval`` seconds, whichever comes first. The poll is only a fallback: a notification
missed (a connection lost and made again) delays a message by at most one interval.

Exactly once into the broker: a relay that dies after publishing a batch and before its commit
leaves the rows (the server rolls its transaction back), and the next relay publishes them
again; ``publish_once`` skips what it stored already, a row at a time (rows are never changed
once written: on Redis each row's messages in a queue are stored whole under the id of the
first of them, and the newest ``ONCE_KEEP`` such keys of each queue, at least, are remembered;
on NATS each message's id, within the stream's duplicate window).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg

from ...errors import HurtleError
from ...message import CheckedBatch, Message
from ..base import Broker
from .connection import connection_error
from .outbox import BATCH, OutboxTable

log = logging.getLogger(__name__)

#: Seconds between two looks at the outbox when no notification came, and between two tries at
#: the lock by a relay that waits for its turn.
POLL_INTERVAL = 1.0
#: Seconds before a relay that failed (a server down) tries again.
RETRY_DELAY = 1.0
#: Most messages the relay moves in one batch: four rows of a ``send_many`` of 1,000 or more.
#: A relay behind its writers catches up with a quarter of the round trips, statements and
#: script calls it took with batches of one row, and leaves the CPU they cost to the writers.
RELAY_BATCH = 4 * BATCH


class Relay:
    """Moves the committed messages of ``table`` to ``broker`` while it holds the outbox's
    lock (``run``), or as a single pass (``move``)."""

    def __init__(
        self,
        table: OutboxTable,
        broker: Broker,
        *,
        poll_interval: float = POLL_INTERVAL,
        batch: int = RELAY_BATCH,
    ) -> None:
        self.table = table
        self.broker = broker
        self.poll_interval = poll_interval
        self.batch = batch
        #: Set while this relay holds the lock (and so is the one at work).
        self.active = threading.Event()
        #: Messages this relay published (``publish_once``: repeats included).
        self.relayed = 0
        #: Messages it moved to the outbox's dead table instead (``_bury``).
        self.buried = 0

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set: wait for the lock, then move rows as they commit. A
        failure (the database or the broker unreachable) is logged, and the relay starts over
        after ``RETRY_DELAY`` seconds."""
        while not stop.is_set():
            try:
                self._session(stop)
            except HurtleError as err:
                log.warning("outbox relay %s: %s; trying again", self.table.url, err)
                stop.wait(RETRY_DELAY)

    def _session(self, stop: threading.Event) -> None:
        conn = self.table.connect()
        try:
            if not self._lock(conn, stop):
                return
            log.info("relaying the outbox %s to %s", self.table.url, self.broker.url)
            try:
                # a commit lost in a crash of the server leaves its batch to publish again,
                # which publish_once skips: no need to wait for the disk at each commit
                conn.execute("SET synchronous_commit = off")
                conn.execute(f'LISTEN "{self.table.channel}"')
                while not stop.is_set():
                    if self.move(conn) < self.batch:
                        self._wait(conn)
            except psycopg.Error as err:
                raise connection_error(self.table.url, err, "relaying the outbox") from err
        finally:
            self.active.clear()
            conn.close()

    def _lock(self, conn: psycopg.Connection[Any], stop: threading.Event) -> bool:
        """Wait until this relay holds the outbox's lock (True), or ``stop`` is set."""
        waited = False
        while not stop.is_set():
            try:
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (self.table.lock_key,)
                ).fetchone()
            except psycopg.Error as err:
                raise connection_error(self.table.url, err, "taking the relay's lock") from err
            if row is not None and row[0]:
                self.active.set()
                return True
            if not waited:
                log.debug("another relay moves the outbox %s: waiting", self.table.url)
                waited = True
            stop.wait(self.poll_interval)
        return False

    def _wait(self, conn: psycopg.Connection[Any]) -> None:
        for _ in conn.notifies(timeout=self.poll_interval, stop_after=1):
            pass

    def move(self, conn: psycopg.Connection[Any]) -> int:
        """Publish the oldest rows that start within the first ``batch`` messages, and delete
        them: one statement, whose transaction commits only after the publish; how many
        messages there were (fewer than twice ``batch``). Only for the holder
        of the lock (``run``): two at once would publish rows twice."""
        with conn.transaction():
            rows = conn.execute(self.table.TAKE, (self.batch, self.batch), binary=True).fetchall()
            if not rows:
                return 0
            rows.sort()  # oldest first: RETURNING keeps no order
            payloads = [raw for _, bodies in rows for raw in bodies]
            taken = len(payloads)
            # a row is stored or skipped whole, under its first message's id (in each queue):
            # rows are never changed once written, so a batch taken again has the same rows
            units = [len(bodies) for _, bodies in rows]
            most = self.broker.max_message_size
            if max(map(len, payloads)) > most:  # one pass over the lengths per batch
                payloads, units = self._bury(conn, rows, most)
            # checked when they were sent: the broker skips its pass over them
            messages = CheckedBatch(map(Message.decode, payloads))
            if payloads:
                self.broker.publish_once(messages, payloads, units)
        self.relayed += len(payloads)
        return taken

    def _bury(
        self, conn: psycopg.Connection[Any], rows: list[Any], most: int
    ) -> tuple[list[bytes], list[int]]:
        """Move the messages of ``rows`` larger than ``most`` bytes (the outbox takes up to
        ``MAX_SIZE``; the broker, maybe less) to the outbox's dead table, in the relay's
        transaction, and return the others with their rows' sizes (a row left empty, none).
        Each is logged as an error with its id and what to do."""
        fit, units, ids, queues, reasons, bodies = [], [], [], [], [], []
        for raw in (raw for _, row in rows for raw in row):
            if len(raw) <= most:
                fit.append(raw)
                continue
            message = Message.decode(raw)
            reason = (
                f"{len(raw):,} bytes encoded, larger than the {most:,} bytes "
                f"{self.broker.url} stores in one message: never published"
            )
            ids.append(message.id)
            queues.append(message.queue)
            reasons.append(reason)
            bodies.append(bytes(raw))
            log.error(
                "outbox %s: message %s of %s (%s) is %s; kept in %s.outbox_dead (send smaller "
                "arguments: a key to the data rather than the data)",
                self.table.url,
                message.id,
                message.queue,
                message.task,
                reason,
                self.table.schema,
            )
        conn.execute(self.table.BURY, (ids, queues, reasons, bodies))
        self.buried += len(ids)
        for _, row in rows:
            kept = sum(len(raw) <= most for raw in row)
            if kept:
                units.append(kept)
        return fit, units
