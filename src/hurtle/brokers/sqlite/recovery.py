"""Recovery: what silent workers held goes back, and messages whose workers keep dying are
quarantined, let out one at a time, and dead-lettered past ``max_recoveries`` once their worker
died holding them alone (or no other message let out that way), with what waits on them ended
in the same transaction (``common.dead_ends``: their records, their unique locks)."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3

from ..common import DEAD, QUARANTINE, dead_ends, fate, lost_reason, suspects
from .connection import _Connection
from .schema import (
    _IDS,
    _INSERT,
    _INSERT_DEAD,
    _PUT_RESULT,
    _TAKE_BACK_RANGE,
    Rows,
    _dead_row,
    _next_ids,
    _requeue,
)

log = logging.getLogger(__name__)

#: Most recovered messages whose deaths the file remembers (those with the fewest go first).
MAX_DEATHS = 10_000


class _Recovery(_Connection):
    """``SQLiteBroker``'s recovery of dead workers' deliveries."""

    max_recoveries: int

    def _recover_in(self, conn: sqlite3.Connection, now: float) -> tuple[int, bool, bool]:
        """Forget workers whose deadline passed, and re-queue what every claim of a worker not
        in ``workers`` still holds (theirs, and any left without a worker); then let one
        quarantined message out per queue. Returns (deliveries recovered, whether one was let
        out, whether more wait in quarantine)."""
        dead = [
            r[0] for r in conn.execute("SELECT worker_id FROM workers WHERE deadline < ?", (now,))
        ]
        if dead:
            conn.execute(f"DELETE FROM workers WHERE worker_id IN ({_IDS})", (json.dumps(dead),))
        # one row per outstanding batch, not per message: this scan stays short
        orphans = conn.execute(
            "SELECT batch, worker, queue, priority, lo, hi FROM claims "
            "WHERE worker NOT IN (SELECT worker_id FROM workers)"
        ).fetchall()
        moved = 0
        if orphans:
            held: dict[str, Rows] = {}
            for _, worker, queue, priority, lo, hi in orphans:
                held.setdefault(worker, []).extend(
                    conn.execute(_TAKE_BACK_RANGE, (queue, priority, lo, hi)).fetchall()
                )
            conn.execute(
                f"DELETE FROM claims WHERE batch IN ({_IDS})",
                (json.dumps([c[0] for c in orphans]),),
            )
            back: Rows = []
            for rows in held.values():
                back += self._sort_out(conn, rows, now)
                moved += len(rows)
            _requeue(conn, back)
            if moved:
                log.warning(
                    "recovered %d deliveries held by silent workers %s",
                    moved,
                    sorted({c[1] for c in orphans}),
                )
                extra = conn.execute("SELECT count(*) FROM deaths").fetchone()[0] - MAX_DEATHS
                if extra > 0:
                    conn.execute(
                        "DELETE FROM deaths WHERE (queue, digest) IN (SELECT queue, digest "
                        "FROM deaths ORDER BY n LIMIT ?)",
                        (extra,),
                    )
        return moved, *self._let_out(conn)

    def _sort_out(self, conn: sqlite3.Connection, rows: Rows, now: float) -> Rows:
        """Count a death for each row one dead worker held; quarantine those that died before
        and dead-letter, past ``max_recoveries``, the only suspect: the one row it held, or its
        one probe. Returns the rows to re-queue."""
        digests = [hashlib.sha1(body).hexdigest() for _, _, _, body in rows]
        probe = [
            conn.execute(
                "DELETE FROM probes WHERE queue = ? AND digest = ? RETURNING 1", (row[0], digest)
            ).fetchone()
            is not None
            for row, digest in zip(rows, digests, strict=True)
        ]
        # a lone probe across all its queues, unlike Redis (one queue per script)
        back: Rows = []
        for row, digest, suspect in zip(rows, digests, suspects(probe), strict=True):
            queue, priority, _, body = row
            deaths: int = conn.execute(
                "INSERT INTO deaths (queue, digest, n) VALUES (?, ?, 1) "
                "ON CONFLICT (queue, digest) DO UPDATE SET n = n + 1 RETURNING n",
                (queue, digest),
            ).fetchone()[0]
            what = fate(deaths, suspect, self.max_recoveries)
            if what == DEAD:
                conn.execute("DELETE FROM deaths WHERE queue = ? AND digest = ?", (queue, digest))
                reason = lost_reason(deaths, self.max_recoveries)
                conn.execute(_INSERT_DEAD, _dead_row(queue, reason, body, now))
                records, lock = dead_ends(body, reason)
                for r in records:  # what waits on it ends in the same transaction
                    conn.execute(_PUT_RESULT, (r.id, now + r.ttl, r.payload))
                if lock is not None:
                    conn.execute(
                        "DELETE FROM uniques WHERE queue = ? AND key = ? AND id = ?",
                        (queue, lock[0], lock[1]),
                    )
            elif what == QUARANTINE:
                conn.execute(
                    "INSERT INTO quarantine (queue, priority, body) VALUES (?, ?, ?)",
                    (queue, priority, body),
                )
            else:
                back.append(row)
        return back

    def _let_out(self, conn: sqlite3.Connection) -> tuple[bool, bool]:
        """Per queue, let one quarantined message out unless the last one is still ready.
        Returns (whether one was let out, whether more wait).

        One statement when nothing waits: it runs on every heartbeat, and a heartbeat thread
        competing for the GIL with a task that computes pays for each statement."""
        queues = conn.execute("SELECT DISTINCT queue FROM quarantine").fetchall()
        if not queues:
            return False, False
        # a probe whose row is gone was settled (or recovered: then it was handled above)
        conn.execute(
            "DELETE FROM probes WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE "
            "m.queue = probes.queue AND m.priority = probes.priority AND m.id = probes.id)"
        )
        released = False
        for (queue,) in queues:
            waiting = conn.execute(
                "SELECT 1 FROM probes p JOIN cursors c ON c.queue = p.queue "
                "AND c.priority = p.priority WHERE p.queue = ? AND p.id > c.last",
                (queue,),
            ).fetchone()
            if waiting:
                continue
            seq, priority, body = conn.execute(
                "SELECT seq, priority, body FROM quarantine WHERE queue = ? ORDER BY seq LIMIT 1",
                (queue,),
            ).fetchone()
            conn.execute("DELETE FROM quarantine WHERE seq = ?", (seq,))
            id_ = _next_ids(conn, 1)
            conn.execute(_INSERT, (queue, priority, id_, body))
            conn.execute(
                "INSERT OR REPLACE INTO probes (queue, digest, priority, id) VALUES (?, ?, ?, ?)",
                (queue, hashlib.sha1(body).hexdigest(), priority, id_),
            )
            released = True
        pending = conn.execute("SELECT EXISTS (SELECT 1 FROM quarantine)").fetchone()[0]
        return released, bool(pending)
