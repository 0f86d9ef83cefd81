"""``PostgresConsumer``: one worker's session — claims with ``SKIP LOCKED``, waits woken by
``NOTIFY``, settling, concurrency slots, heartbeats and reports.

A fetch can fail although its claim committed: the server went away between its commit and its
reply. The rows it claimed are in the worker's name, kept by its heartbeat, yet handed to no one.
So the consumer knows which receipts it handed out and has not settled (a set, in memory), and
after a failed fetch its next fetch first hands over the rows in its name that are not among
them (one scan of ``messages``, after a failure only). Settling is harmless to send again: a row
already deleted or given back is no longer held, and settling it finds nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ...errors import BrokerError
from ...message import Message
from ..consumer import BatchConsumer, beat_through, fetch_wait
from ..records import Delivery, FlowStep, Lock, StoredResult
from ..reports import WorkerReport, encode_report
from . import flows
from .listener import POLL_INTERVAL
from .prefetch import Prefetch
from .publishing import store
from .sql import holder_key, id_array

if TYPE_CHECKING:
    from .broker import PostgresBroker


Item = TypeVar("Item")

log = logging.getLogger(__name__)


def _receipts(deliveries: Sequence[Delivery]) -> list[int]:
    return [d.receipt for d in deliveries]


def _nothing(cur: psycopg.Cursor[Any]) -> None:
    return None


def _all(cur: psycopg.Cursor[Any]) -> list[Any]:
    return cur.fetchall()


class PostgresConsumer(BatchConsumer):
    combines_ack_and_fetch = True

    def __init__(self, broker: PostgresBroker, queues: tuple[str, ...], worker_id: str) -> None:
        self.broker = broker
        self.queues = queues
        self.worker_id = worker_id
        #: This worker's own timeout: its deadline, as other workers see it, is a beat plus this.
        self.heartbeat_timeout = broker.heartbeat_timeout
        self._queue_list = list(queues)
        self._holder_key = holder_key(broker.schema, worker_id)
        #: Receipts handed out and not settled yet: what the worker holds. Added to before a
        #: fetch returns; removed from once a settling committed (never before: a take-back
        #: meanwhile would hand a row out again).
        self._held: set[int] = set()
        #: Set when a fetch failed: its claim may have committed, its rows in this worker's
        #: name but held by no one (``_take_back``).
        self._unsure = False
        #: The claim a solo worker sends before it runs a batch, and the acknowledgements
        #: owed to it; and whether the last fetch came back full (worth prefetching after).
        self._ahead = Prefetch(self._claim_ahead)
        self._full = False
        sql = broker._sql
        if len(queues) == 1:
            self._claim_sql = sql.CLAIM_ONE
        else:
            self._claim_sql = sql.CLAIM_MANY
        try:
            broker._run(
                "registering a worker",
                lambda cur: cur.execute(sql.UPSERT_WORKER, (worker_id, self.heartbeat_timeout)),
                transaction=False,
            )
        except BrokerError:
            # the server is away (restarting): the first claim registers the worker (its
            # ADD_WORKER), and the worker's fetches wait for the server as Redis's do
            if not broker._unchecked:
                raise

    # -- fetching --------------------------------------------------------------------------

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        return self._fetch((), max_count, timeout)

    def ack_and_fetch(
        self, deliveries: Sequence[Delivery], max_count: int, timeout: float
    ) -> list[Delivery]:
        """One round trip deletes the acknowledged rows and claims the next batch; when a
        prefetched batch is there, it is returned and the rows are deleted by the next claim
        (``prefetch.py``)."""
        return self._fetch(_receipts(deliveries), max_count, timeout)

    def prefetch(self, max_count: int) -> None:
        # after a full batch only: one that came short found the queue running dry, and the
        # claim would most likely come back empty
        if self._full and self.queues:
            self._ahead.start(max_count)

    def take_prefetched(self) -> list[Delivery]:
        if not self._ahead.pending:
            return []
        try:
            return self._ahead.collect()[0]
        except BrokerError:
            self._unsure = True
            raise

    def _claim_ahead(self, max_count: int, settle: Sequence[int]) -> tuple[list[Delivery], bool]:
        out = self._claim(max_count, settle)[0]
        return out, bool(out) and self.cancellations

    def _fetch(self, settle: Sequence[int], max_count: int, timeout: float) -> list[Delivery]:
        ahead = self._ahead
        if ahead.pending:
            got, cancellations, asked = ahead.collect()
            if got:
                ahead.owe(settle)
                self.cancellations = cancellations
                self._full = len(got) >= asked
                return got
        owed = ahead.owed
        settle = ahead.take_owed(settle)
        try:
            out = self._fetch_now(settle, max_count, timeout)
        except BrokerError:
            ahead.give_back(owed)
            raise
        self._full = len(out) >= max_count
        return out

    def _fetch_now(self, settle: Sequence[int], max_count: int, timeout: float) -> list[Delivery]:
        if not self.queues or max_count <= 0:
            if settle:
                self._settle(settle)
            if timeout > 0:
                time.sleep(timeout)
            return []
        listener = self.broker._listener
        deadline = time.monotonic() + timeout
        while True:
            ticket = listener.ticket(self.queues) if timeout > 0 else 0
            out, next_eta = self._claim(max_count, settle)
            settle = ()
            if out:
                return out
            due_in = None if next_eta is None else max(next_eta - time.time(), 0.0)
            wait = fetch_wait(deadline, POLL_INTERVAL, due_in)
            if wait is None:
                return out
            if wait > 0:
                listener.wait(self.queues, ticket, wait)

    def _claim(
        self, max_count: int, settle: Sequence[int] = ()
    ) -> tuple[list[Delivery], float | None]:
        """Settle ``settle``, promote due delayed rows and claim up to ``max_count``, in one
        transaction sent in one round trip (one commit for the batch). Returns the deliveries
        and, when there were none, the nearest eta of a delayed message of the consumer's
        queues."""
        if self._unsure:
            taken = self._take_back(max_count, settle)
            settle = ()
            if taken:
                return taken, None
        sql = self.broker._sql
        worker_id = self.worker_id
        queues = self._queue_list
        if len(queues) == 1:
            params: tuple[Any, ...] = (queues[0], queues[0], max_count, worker_id, worker_id)
        else:
            params = (queues, max_count, max_count, worker_id, worker_id)

        def send(cur: psycopg.Cursor[Any]) -> None:
            if settle:
                cur.execute(sql.SETTLE, (id_array(settle), worker_id))
            # known again if declared dead meanwhile: what it takes stays recoverable
            cur.execute(sql.ADD_WORKER, (worker_id, self.heartbeat_timeout))
            # after the worker row (which recovery may be deleting: no lock held meanwhile)
            cur.execute(sql.SHARE_KEY, (self._holder_key,))
            cur.execute(sql.PROMOTE, (queues,))
            cur.execute(sql.PIN_CLAIM_PLAN)
            cur.execute(self._claim_sql, params)

        b = self.broker
        try:
            rows = b._send(f"fetching from {', '.join(self.queues)}", send, _all)
        except BrokerError:
            self._unsure = True  # committed or not: the reply is lost
            raise
        if settle:
            self._held.difference_update(settle)
        if not rows:
            with b._cursor("reading the next delayed message") as cur:
                row = cur.execute(sql.NEXT_ETA, (queues,)).fetchone()
            return [], None if row is None or row[0] is None else float(row[0])
        return self._hand_out(rows), None

    def _hand_out(self, rows: Sequence[Any]) -> list[Delivery]:
        """Deliveries of claimed rows ``(queue, id, body, cancellations)``, held from now on."""
        self.cancellations = bool(rows[0][3])
        out = [Delivery(queue, body, id_) for queue, id_, body, _ in rows]
        self._held.update(_receipts(out))
        return out

    def _take_back(self, max_count: int, settle: Sequence[int]) -> list[Delivery]:
        """After a failed fetch: up to ``max_count`` rows in this worker's name that it does
        not hold (claimed by a transaction whose reply was lost), settling ``settle`` in the
        same transaction. The doubt ends once fewer than ``max_count`` are left."""
        b = self.broker
        sql = b._sql
        held = list(self._held.copy())  # one step: the acker's thread settles meanwhile

        def run(cur: psycopg.Cursor[Any]) -> list[Any]:
            if settle:
                cur.execute(sql.SETTLE, (id_array(settle), self.worker_id))
            # as a claim does: known again if declared dead, and recovery waits for this
            cur.execute(sql.ADD_WORKER, (self.worker_id, self.heartbeat_timeout))
            cur.execute(sql.SHARE_KEY, (self._holder_key,))
            return cur.execute(
                sql.TAKE_BACK, (self.worker_id, id_array(held), max_count)
            ).fetchall()

        rows = b._run("taking back what a failed fetch claimed", run)
        if settle:
            self._held.difference_update(settle)
        if len(rows) < max_count:
            self._unsure = False
        if not rows:
            return []
        log.info("took back %d messages claimed by a fetch whose reply was lost", len(rows))
        return self._hand_out(rows)

    def _let_go(self, deliveries: Sequence[Delivery]) -> None:
        """These deliveries are settled (committed): no longer held."""
        self._held.difference_update(_receipts(deliveries))

    # -- settling --------------------------------------------------------------------------
    # A delivery no longer held (its worker was declared dead and it went back to its queue)
    # is left to whoever holds it now: it went back under a new id, so settling the old
    # receipt finds no row and does nothing.

    def _settle(self, receipts: Sequence[int]) -> None:
        sql = self.broker._sql
        self.broker._run(
            "acknowledging",
            lambda cur: cur.execute(sql.SETTLE, (id_array(receipts), self.worker_id)),
            transaction=False,
        )
        self._held.difference_update(receipts)

    def _settled(self, cur: psycopg.Cursor[Any], deliveries: Sequence[Delivery]) -> dict[int, int]:
        """Delete these held rows; returns the receipts of those that were still held, with
        the priority each was stored under."""
        rows = cur.execute(
            self.broker._sql.SETTLE_RETURNING, (id_array(_receipts(deliveries)), self.worker_id)
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        if not deliveries and not results:
            return
        if not results:
            self._settle(_receipts(deliveries))
            return
        b = self.broker

        def run(cur: psycopg.Cursor[Any]) -> None:
            # one transaction: the acknowledgements say which deliveries were still held, and
            # only their records are stored (a worker taken for dead meanwhile leaves the
            # record to the copy delivered again); records past the deliveries have none
            records = results
            if deliveries:
                held = self._settled(cur, deliveries)
                if len(held) < len(deliveries):
                    n = len(deliveries)
                    records = [
                        r for i, r in enumerate(results) if i >= n or deliveries[i].receipt in held
                    ]
            if records:
                b._put_results(cur, records)

        b._run(f"acknowledging {len(deliveries)} messages with results", run)
        self._let_go(deliveries)

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        flows.ack_flow(self, steps)

    def retry(self, delivery: Delivery, message: Message) -> None:
        raw = message.encode()
        b = self.broker

        def run(cur: psycopg.Cursor[Any]) -> None:
            if self._settled(cur, [delivery]):
                store(
                    cur, b._sql, [(message.queue, message.priority, message.eta, raw)], time.time()
                )

        b._run("scheduling a retry", run)
        self._let_go([delivery])

    def _settle_many(
        self,
        items: Sequence[tuple[Delivery, Item]],
        doing: str,
        then: Callable[[psycopg.Cursor[Any], list[tuple[Delivery, Item, int]]], object],
    ) -> None:
        """Delete the held rows of the deliveries of ``items``, then call ``then`` with those
        that were still held, each with the priority it was stored under: one transaction."""
        if not items:
            return

        def run(cur: psycopg.Cursor[Any]) -> None:
            held = self._settled(cur, [d for d, _ in items])
            then(cur, [(d, x, held[d.receipt]) for d, x in items if d.receipt in held])

        self.broker._run(f"{doing} {len(items)} messages", run)
        self._let_go([d for d, _ in items])

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        """Every dead letter in one transaction."""
        b = self.broker
        self._settle_many(
            items,
            "dead-lettering",
            lambda cur, kept: b._insert_dead(cur, [(d.queue, why, d.raw) for d, why, _ in kept]),
        )

    def defer_many(self, items: Sequence[tuple[Delivery, float]]) -> None:
        """Every deferral in one transaction, each back at the priority it had."""
        b = self.broker
        self._settle_many(
            items,
            "deferring",
            lambda cur, kept: store(
                cur, b._sql, [(d.queue, p, eta, d.raw) for d, eta, p in kept], time.time()
            ),
        )

    def acquire_slots(self, requests: Sequence[tuple[str, int, int]]) -> list[int]:
        b = self.broker
        sql = b._sql

        def run(cur: psycopg.Cursor[Any]) -> list[int]:
            cur.execute(sql.ADD_WORKER, (self.worker_id, self.heartbeat_timeout))
            for key in sorted({r[0] for r in requests}):  # one order: no deadlock
                cur.execute(sql.LOCK_KEY, (f"{b.schema}\nslots\n{key}",))
            out = []
            for key, limit, wanted in requests:
                cur.execute(sql.FREE_DEAD_SLOTS, (key,))
                row = cur.execute(sql.SLOTS_TAKEN, (key,)).fetchone()
                granted = max(0, min(wanted, limit - int(row[0] if row else 0)))
                if granted:
                    cur.execute(sql.TAKE_SLOTS, (key, self.worker_id, granted))
                out.append(granted)
            return out

        return b._run("taking concurrency slots", run)

    def release_slots(self, releases: Sequence[tuple[str, int]]) -> None:
        b = self.broker
        sql = b._sql

        def run(cur: psycopg.Cursor[Any]) -> None:
            keys, counts = [k for k, _ in releases], [n for _, n in releases]
            cur.execute(sql.GIVE_SLOTS, (keys, counts, self.worker_id))
            cur.execute(sql.FORGET_SLOTS, (self.worker_id,))

        b._run("giving back concurrency slots", run)

    def release_unique(self, locks: Sequence[Lock]) -> None:
        if not locks:
            return
        sql = self.broker._sql
        columns = (
            [lock[0] for lock in locks],
            [lock[1] for lock in locks],
            [lock[2] for lock in locks],
        )
        self.broker._run(
            "releasing unique locks",
            lambda cur: cur.execute(sql.RELEASE_UNIQUE, columns),
            transaction=False,
        )

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give them back, under new ids: at the back of their priority."""
        if not deliveries:
            return
        b = self.broker

        def run(cur: psycopg.Cursor[Any]) -> None:
            rows = cur.execute(
                b._sql.REQUEUE, (id_array(_receipts(deliveries)), self.worker_id)
            ).fetchall()
            b._notify_ready(cur, (r[0] for r in rows))

        b._run(f"releasing {len(deliveries)} messages", run)
        self._let_go(deliveries)

    # -- heartbeats and reports ------------------------------------------------------------

    def heartbeat(self) -> bool:
        b = self.broker
        with self._reporting() as report:

            def run(cur: psycopg.Cursor[Any]) -> bool:
                cur.execute(b._sql.UPSERT_WORKER, (self.worker_id, self.heartbeat_timeout))
                if report is not None:
                    self._store_report(cur, report)
                _, _, pending = b._recover_in(cur)
                return pending

            return b._run("beating", run)

    def send_report(self) -> None:
        with self._reporting() as report:
            if report is not None:
                self.broker._run("sending a report", lambda cur: self._store_report(cur, report))

    def _store_report(self, cur: psycopg.Cursor[Any], report: WorkerReport) -> None:
        sql = self.broker._sql
        cur.execute(sql.FORGET_REPORTS)
        cur.execute(
            sql.UPSERT_REPORT, (self.worker_id, self.heartbeat_timeout, encode_report(report))
        )
        self._add_totals(cur, report)

    def _add_totals(self, cur: psycopg.Cursor[Any], report: WorkerReport) -> None:
        delta = report.delta
        if delta:
            cur.execute(
                self.broker._sql.ADD_TOTALS,
                (
                    [c.queue for c in delta],
                    [c.task for c in delta],
                    [c.processed for c in delta],
                    [c.failed for c in delta],
                    [c.retried for c in delta],
                    [c.dead_lettered for c in delta],
                ),
            )

    def heartbeat_session(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        b = self.broker
        own = type(b)(  # a broker of its own: its own connections, to the same database
            b._given_url,
            heartbeat_timeout=self.heartbeat_timeout,
            dead_letter_max=b.dead_letter_max,
            dead_letter_ttl=b.dead_letter_ttl,
            max_recoveries=b.max_recoveries,
        )
        return beat_through(own, self)

    def close(self) -> None:
        b = self.broker
        if b._closed:
            return
        sql = b._sql
        if self._ahead.pending:  # what it claimed is handed back below with the rest
            with contextlib.suppress(BrokerError):
                self._ahead.collect()
        owed = id_array(self._ahead.take_owed(()))
        with self._reporting() as report:

            def run(cur: psycopg.Cursor[Any]) -> None:
                # acknowledged: deleted, not handed back
                cur.execute(sql.SETTLE, (owed, self.worker_id))
                if report is not None:  # leaves with its last counts in the totals
                    cur.execute(sql.FORGET_REPORT, (self.worker_id,))
                    self._add_totals(cur, report)
                rows = cur.execute(sql.REQUEUE_WORKER, (self.worker_id,)).fetchall()
                b._notify_ready(cur, (r[0] for r in rows))
                cur.execute(sql.FORGET_HOLDER, (self.worker_id,))
                cur.execute(sql.FORGET_WORKER, (self.worker_id,))
                cur.execute(sql.FORGET_WORKER_SLOTS, (self.worker_id,))

            b._run("closing a worker's session", run)
            self._held.clear()
