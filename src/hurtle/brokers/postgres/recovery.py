"""Recovery: what silent workers held goes back, and messages whose workers keep dying are
quarantined, let out one at a time, and dead-lettered past ``max_recoveries`` once their worker
died holding them alone (or no other message let out that way), with what waits on them ended
in the same transaction (``common.dead_ends``: their records, their unique locks)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from ...ids import new_id
from ...message import message_id
from ..columns import StoredResults
from ..common import DEAD, QUARANTINE, dead_ends, fate, log_trimmed, lost_reason, suspects
from ..records import StoredResult
from .connection import _Connection
from .listener import payloads
from .sql import holder_key

log = logging.getLogger(__name__)

#: Most recovered messages whose deaths the database remembers (those with the fewest go first).
MAX_DEATHS = 10_000

#: ``(queue, priority, id, body)`` of a held row taken back.
Row = tuple[str, int, int, bytes]

_FORGET_DEAD = "DELETE FROM {s}.workers WHERE deadline < {now}"
# Workers that may hold rows and have no row in ``workers``: a read of ``holders`` (a row per
# worker).
_ORPHANED = (
    "SELECT worker FROM {s}.holders h WHERE NOT EXISTS "
    "(SELECT 1 FROM {s}.workers w WHERE w.worker_id = h.worker)"
)
# what one of them holds, found by a scan of the table (no index names ``worker``, so that a
# claim is a HOT update): once per dead worker
_TAKE_BACK = (
    "DELETE FROM {s}.messages WHERE worker = %s "
    "AND NOT EXISTS (SELECT 1 FROM {s}.workers WHERE worker_id = %s) "
    "RETURNING queue, priority, id, body"
)
# unless it came back meanwhile (a claim registers its worker again)
_FORGET_ORPHAN = (
    "DELETE FROM {s}.holders WHERE worker = %s "
    "AND NOT EXISTS (SELECT 1 FROM {s}.workers WHERE worker_id = %s)"
)
_COUNT_DEATH = (
    "INSERT INTO {s}.deaths AS d (queue, digest, n) VALUES (%s, %s, 1) "
    "ON CONFLICT (queue, digest) DO UPDATE SET n = d.n + 1 RETURNING n"
)
_TRIM_DEATHS = (
    "DELETE FROM {s}.deaths WHERE (queue, digest) IN (SELECT queue, digest FROM {s}.deaths "
    "ORDER BY n LIMIT (SELECT greatest(count(*) - %s, 0) FROM {s}.deaths))"
)
_QUARANTINED = "SELECT DISTINCT queue FROM {s}.quarantine"
# a probe whose row is gone was settled (or recovered: then it was handled on the way)
_DROP_SETTLED_PROBES = (
    "DELETE FROM {s}.probes p WHERE NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.id = p.id)"
)
_PROBE_WAITING = (
    "SELECT 1 FROM {s}.probes p JOIN {s}.messages m ON m.id = p.id "
    "WHERE p.queue = %s AND m.worker IS NULL LIMIT 1"
)
_LET_OUT = (
    "WITH q AS (DELETE FROM {s}.quarantine WHERE seq = (SELECT seq FROM {s}.quarantine "
    "WHERE queue = %s ORDER BY seq LIMIT 1) RETURNING queue, priority, body) "
    "INSERT INTO {s}.messages (queue, priority, body) SELECT queue, priority, body FROM q "
    "RETURNING id, body"
)
_ADD_PROBE = (
    "INSERT INTO {s}.probes (queue, digest, id) VALUES (%s, %s, %s) "
    "ON CONFLICT (queue, digest) DO UPDATE SET id = excluded.id"
)


def _one(cur: psycopg.Cursor[Any]) -> Any:
    """The first column of the one row a statement returns."""
    row = cur.fetchone()
    assert row is not None
    return row[0]


def _digest(body: bytes) -> str:
    return hashlib.sha1(body).hexdigest()


class _Recovery(_Connection):
    """``PostgresBroker``'s recovery of dead workers' deliveries."""

    max_recoveries: int
    dead_letter_max: int
    dead_letter_ttl: float

    def _q(self, template: str) -> str:
        return self._sql.format(template)

    def _recover_in(self, cur: psycopg.Cursor[Any]) -> tuple[int, bool, bool]:
        """Forget workers whose deadline passed, and re-queue what every worker without a row
        in ``workers`` still holds; then let one quarantined message out per queue. Returns
        (deliveries recovered, whether one was let out, whether more wait in quarantine)."""
        cur.execute(self._q(_FORGET_DEAD))
        orphans = [r[0] for r in cur.execute(self._q(_ORPHANED)).fetchall()]
        moved = 0
        woken: set[str] = set()
        if orphans:
            back: list[Row] = []
            for worker in sorted(orphans):  # their keys in one order: no deadlock
                # waits for a claim of this worker in flight: what it took is seen once done
                cur.execute(self._sql.LOCK_KEY, (holder_key(self.schema, worker),))
                rows: list[Row] = cur.execute(self._q(_TAKE_BACK), (worker, worker)).fetchall()
                cur.execute(self._q(_FORGET_ORPHAN), (worker, worker))
                back += self._sort_out(cur, rows)
                moved += len(rows)
            if back:
                back.sort(key=lambda r: (r[0], r[1], r[2]))
                cur.execute(
                    self._sql.INSERT,
                    ([r[0] for r in back], [r[1] for r in back], [r[3] for r in back]),
                )
                woken.update(r[0] for r in back)
            if moved:
                log.warning("recovered %d deliveries held by silent workers %s", moved, orphans)
                cur.execute(self._q(_TRIM_DEATHS), (MAX_DEATHS,))
        released, pending = self._let_out(cur, woken)
        if woken:
            cur.execute(self._sql.NOTIFY_MANY, (self._sql.ready_channel, payloads(woken)))
        return moved, released, pending

    def _sort_out(self, cur: psycopg.Cursor[Any], rows: list[Row]) -> list[Row]:
        """Count a death for each row one dead worker held; quarantine those that died before
        and dead-letter, past ``max_recoveries``, the only suspect (``common.suspects``).
        Returns the rows to re-queue."""
        if not rows:
            return []
        digests = [_digest(body) for _, _, _, body in rows]
        probes = [
            cur.execute(
                self._q("DELETE FROM {s}.probes WHERE queue = %s AND digest = %s RETURNING 1"),
                (row[0], digest),
            ).fetchone()
            is not None
            for row, digest in zip(rows, digests, strict=True)
        ]
        back: list[Row] = []
        for row, digest, suspect in zip(rows, digests, suspects(probes), strict=True):
            queue, priority, _, body = row
            deaths = _one(cur.execute(self._q(_COUNT_DEATH), (queue, digest)))
            what = fate(deaths, suspect, self.max_recoveries)
            if what == DEAD:
                cur.execute(
                    self._q("DELETE FROM {s}.deaths WHERE queue = %s AND digest = %s"),
                    (queue, digest),
                )
                self._bury(cur, queue, body, lost_reason(deaths, self.max_recoveries))
            elif what == QUARANTINE:
                cur.execute(
                    self._q(
                        "INSERT INTO {s}.quarantine (queue, priority, body) VALUES (%s, %s, %s)"
                    ),
                    (queue, priority, body),
                )
            else:
                back.append(row)
        return back

    def _bury(self, cur: psycopg.Cursor[Any], queue: str, body: bytes, reason: str) -> None:
        """Dead-letter ``body`` as the broker's own decision, ending what waits on it."""
        self._insert_dead(cur, [(queue, reason, body)])
        records, lock = dead_ends(body, reason)
        if records:
            self._put_results(cur, records)
        if lock is not None:
            cur.execute(self._sql.RELEASE_UNIQUE, ([queue], [lock[0]], [lock[1]]))

    def _let_out(self, cur: psycopg.Cursor[Any], woken: set[str]) -> tuple[bool, bool]:
        """Per queue, let one quarantined message out unless the last one is still ready.
        Returns (whether one was let out, whether more wait)."""
        queues = [r[0] for r in cur.execute(self._q(_QUARANTINED)).fetchall()]
        if not queues:
            return False, False
        cur.execute(self._q(_DROP_SETTLED_PROBES))
        released = False
        for queue in queues:
            if cur.execute(self._q(_PROBE_WAITING), (queue,)).fetchone() is not None:
                continue
            row = cur.execute(self._q(_LET_OUT), (queue,)).fetchone()
            if row is None:
                continue
            cur.execute(self._q(_ADD_PROBE), (queue, _digest(row[1]), row[0]))
            woken.add(queue)
            released = True
        pending = cur.execute(self._q("SELECT EXISTS (SELECT 1 FROM {s}.quarantine)")).fetchone()
        return released, bool(pending and pending[0])

    # -- shared with the consumers -------------------------------------------------------

    def _insert_dead(self, cur: psycopg.Cursor[Any], rows: list[tuple[str, str, bytes]]) -> None:
        """Record ``(queue, reason, body)`` dead letters, then drop each queue's past the ttl
        and beyond the cap (``common.log_trimmed``)."""
        if not rows:
            return
        cur.execute(
            self._sql.INSERT_DEAD,
            (
                [new_id() for _ in rows],
                [q for q, _, _ in rows],
                [r for _, r, _ in rows],
                [b for _, _, b in rows],
                [message_id(b) or None for _, _, b in rows],
            ),
        )
        for queue in sorted({q for q, _, _ in rows}):
            expired = dropped = 0
            if self.dead_letter_ttl:
                cur.execute(self._sql.EXPIRE_DEAD, (queue, queue, self.dead_letter_ttl))
                expired = cur.rowcount
            if self.dead_letter_max:
                cur.execute(self._sql.CAP_DEAD, (queue, queue, self.dead_letter_max))
                dropped = cur.rowcount
            log_trimmed(self, queue, expired, dropped)  # type: ignore[arg-type]

    def _put_results(self, cur: psycopg.Cursor[Any], records: Sequence[StoredResult]) -> None:
        """Store result records (after a bounded sweep of expired ones), and tell their waiters
        when the transaction commits."""
        sql = self._sql
        cur.execute(sql.EXPIRE_RESULTS)
        if isinstance(records, StoredResults):
            ids, bodies = _last_of_each(records.ids, records.payloads)
            cur.execute(sql.PUT_RESULTS, (records.ttl, ids, bodies))
        else:
            ids, rows = _last_of_each([r.id for r in records], records)
            cur.execute(
                sql.PUT_RESULTS_TTL, (ids, [float(r.ttl) for r in rows], [r.payload for r in rows])
            )
        cur.execute(sql.NOTIFY_MANY, (sql.results_channel, payloads(ids)))


def _last_of_each(ids: list[str], rows: Sequence[Any]) -> tuple[list[str], Sequence[Any]]:
    """``ids`` and their ``rows`` with only the last row of each id: one ``INSERT ... ON
    CONFLICT DO UPDATE`` may not touch a row twice, and a later record under an id replaces an
    earlier one (two members of one chord dead-lettered in one batch record the chord's failure
    twice)."""
    last = {id_: n for n, id_ in enumerate(ids)}
    if len(last) == len(ids):
        return ids, rows
    kept = sorted(last.values())
    return [ids[n] for n in kept], [rows[n] for n in kept]
