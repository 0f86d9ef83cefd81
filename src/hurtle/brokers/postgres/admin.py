"""The admin side of ``PostgresBroker``: queues and their counts, pause, purge and forget,
cancellations, dead letters, recovery on demand, and the workers' reports and totals."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from ..common import check_cancel_ttl, check_queue_name
from ..records import DeadLetter, QueueStats, StoredResult
from ..reports import TaskCounts, WorkerReport, decode_report
from .listener import payloads
from .recovery import _Recovery

#: The prefix of a progress report's id in ``results`` (message ids never start so).
PROGRESS = "progress:"

_DEAD_COLUMNS = "id, queue, reason, body, failed_at"
# ready, delayed, in flight, dead per queue; quarantined messages count as ready
_STATS = (
    "SELECT q.name, "
    "(SELECT count(*) FROM {s}.messages WHERE queue = q.name AND worker IS NULL) "
    "+ (SELECT count(*) FROM {s}.delayed WHERE queue = q.name AND eta <= {now}) "
    "+ (SELECT count(*) FROM {s}.quarantine WHERE queue = q.name), "
    "(SELECT count(*) FROM {s}.delayed WHERE queue = q.name AND eta > {now}), "
    "(SELECT count(*) FROM {s}.messages WHERE queue = q.name AND worker IS NOT NULL), "
    "(SELECT count(*) FROM {s}.dead WHERE queue = q.name), "
    "EXISTS (SELECT 1 FROM {s}.paused WHERE queue = q.name) "
    "FROM unnest(%b::text[]) AS q(name)"
)
# a row if the queue holds anything (ready, held, delayed, dead, quarantined) or is paused
_HOLDS_ANY = (
    "SELECT EXISTS (SELECT 1 FROM {s}.paused WHERE queue = %s) "
    "OR EXISTS (SELECT 1 FROM {s}.messages WHERE queue = %s) "
    "OR EXISTS (SELECT 1 FROM {s}.delayed WHERE queue = %s) "
    "OR EXISTS (SELECT 1 FROM {s}.dead WHERE queue = %s) "
    "OR EXISTS (SELECT 1 FROM {s}.quarantine WHERE queue = %s)"
)


def _dead(row: tuple[Any, ...]) -> DeadLetter:
    return DeadLetter(
        id=row[0], queue=row[1], reason=row[2], raw=bytes(row[3]), failed_at=float(row[4])
    )


class _Admin(_Recovery):
    """``PostgresBroker``'s admin operations."""

    _listener: Any

    def queues(self) -> list[str]:
        with self._cursor("listing queues") as cur:
            rows = cur.execute(self._q("SELECT name FROM {s}.queues ORDER BY name")).fetchall()
        return [r[0] for r in rows]

    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]:
        def run(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            if queues is None:
                names = [r[0] for r in cur.execute(self._q("SELECT name FROM {s}.queues"))]
            else:
                names = list(queues)
            return cur.execute(self._q(_STATS), (sorted(set(names)),)).fetchall()

        rows = self._run("counting messages", run)  # one snapshot for every count
        return {
            name: QueueStats(
                ready=int(ready),
                delayed=int(delayed),
                in_flight=int(held),
                dead=int(dead),
                paused=bool(paused),
            )
            for name, ready, delayed, held, dead, paused in rows
        }

    def next_delayed(self, queue: str, limit: int) -> list[tuple[float, bytes]] | None:
        with self._cursor("listing delayed messages") as cur:
            rows = cur.execute(
                self._q("SELECT eta, body FROM {s}.delayed WHERE queue = %s ORDER BY eta LIMIT %s"),
                (queue, limit),
            ).fetchall()
        return [(float(r[0]), bytes(r[1])) for r in rows]

    # -- control ---------------------------------------------------------------------------

    # -- progress: rows of ``results`` under ``progress:`` and the message id ----------------

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        if not reports:
            return

        def run(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                self._q(
                    "INSERT INTO {s}.results (id, expires, body) SELECT i, {now} + t, b FROM "
                    "unnest(%b::text[], %b::float8[], %b::bytea[]) AS r(i, t, b) "
                    "ON CONFLICT (id) DO UPDATE SET expires = excluded.expires, "
                    "body = excluded.body"
                ),
                (
                    [PROGRESS + r.id for r in reports],
                    [float(r.ttl) for r in reports],
                    [r.payload for r in reports],
                ),
            )

        self._run("storing progress reports", run)

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        if not ids:
            return []
        with self._cursor("reading progress reports") as cur:
            rows = cur.execute(
                self._q("SELECT id, body FROM {s}.results WHERE id = ANY(%s) AND expires > {now}"),
                ([PROGRESS + i for i in ids],),
            ).fetchall()
        found = {r[0][len(PROGRESS) :]: bytes(r[1]) for r in rows}
        return [found.get(i) for i in ids]

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        ttl = check_cancel_ttl(ttl)

        def run(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(self._q("DELETE FROM {s}.cancelled WHERE until <= {now}"))
            cur.execute(
                self._q(
                    "INSERT INTO {s}.cancelled AS c (id, until) "
                    "SELECT DISTINCT unnest(%b::text[]), {now} + %s ON CONFLICT (id) "
                    "DO UPDATE SET until = greatest(c.until, excluded.until)"
                ),
                ([str(i) for i in ids], ttl),
            )

        self._run("cancelling messages", run)

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        with self._cursor("reading cancellations") as cur:
            rows = cur.execute(
                self._q("SELECT id FROM {s}.cancelled WHERE id = ANY(%s) AND until > {now}"),
                (list(ids),),
            ).fetchall()
        return {r[0] for r in rows}

    def uncancel(self, ids: Sequence[str]) -> None:
        if ids:
            with self._cursor("lifting cancellations") as cur:
                cur.execute(self._q("DELETE FROM {s}.cancelled WHERE id = ANY(%s)"), (list(ids),))

    def pause(self, queue: str) -> None:
        check_queue_name(queue)

        def run(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                self._sql.format("INSERT INTO {s}.queues VALUES (%s) ON CONFLICT DO NOTHING"),
                (queue,),
            )
            cur.execute(
                self._q("INSERT INTO {s}.paused VALUES (%s) ON CONFLICT DO NOTHING"), (queue,)
            )

        self._run(f"pausing queue {queue!r}", run)

    def resume(self, queue: str) -> None:
        check_queue_name(queue)

        def run(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(self._q("DELETE FROM {s}.paused WHERE queue = %s"), (queue,))
            cur.execute(self._sql.NOTIFY, (self._sql.ready_channel, queue))

        self._run(f"resuming queue {queue!r}", run)

    def paused(self) -> set[str]:
        with self._cursor("listing paused queues") as cur:
            return {r[0] for r in cur.execute(self._q("SELECT queue FROM {s}.paused")).fetchall()}

    def forget(self, queue: str) -> bool:
        check_queue_name(queue)

        def run(cur: psycopg.Cursor[Any]) -> bool:
            # the name's row first: a publish of this queue meanwhile waits for this transaction
            cur.execute(self._q("SELECT 1 FROM {s}.queues WHERE name = %s FOR UPDATE"), (queue,))
            row = cur.execute(self._q(_HOLDS_ANY), (queue,) * 5).fetchone()
            if row is not None and row[0]:
                return False
            cur.execute(self._q("DELETE FROM {s}.queues WHERE name = %s"), (queue,))
            return True

        return self._run(f"forgetting queue {queue!r}", run)

    def _stored_purge(self, queues: Sequence[str]) -> int:
        """Delete the waiting rows of every queue of ``queues`` in one transaction."""

        def run(cur: psycopg.Cursor[Any]) -> int:
            n = 0
            for statement in (
                "DELETE FROM {s}.messages WHERE queue = ANY(%s) AND worker IS NULL",
                "DELETE FROM {s}.delayed WHERE queue = ANY(%s)",
                "DELETE FROM {s}.quarantine WHERE queue = ANY(%s)",
            ):
                cur.execute(self._q(statement), (list(queues),))
                n += cur.rowcount
            return n

        return self._run(f"purging queue {queues[0]!r}", run)

    def recover(self) -> int:
        moved, _, _ = self._run("recovering what dead workers held", self._recover_in)
        return moved

    # -- dead letters ----------------------------------------------------------------------

    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        with self._cursor("listing dead letters") as cur:
            rows = cur.execute(
                self._q(
                    f"SELECT {_DEAD_COLUMNS} FROM {{s}}.dead WHERE queue = %s ORDER BY seq "
                    "LIMIT %s OFFSET %s"
                ),
                (queue, limit, offset),
            ).fetchall()
        return [_dead(r) for r in rows]

    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        with self._cursor("finding a dead letter") as cur:  # the dead_message index
            row = cur.execute(
                self._q(
                    f"SELECT {_DEAD_COLUMNS} FROM {{s}}.dead WHERE message_id = %s "
                    "ORDER BY seq DESC LIMIT 1"
                ),
                (message_id,),
            ).fetchone()
        return None if row is None else _dead(row)

    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        with self._cursor("deleting dead letters") as cur:
            cur.execute(
                self._q("DELETE FROM {s}.dead WHERE queue = %s AND id = ANY(%s)"),
                (queue, list(ids)),
            )
            return int(cur.rowcount)

    def _stored_purge_dead(self, queue: str) -> int:
        with self._cursor("purging dead letters") as cur:
            cur.execute(self._q("DELETE FROM {s}.dead WHERE queue = %s"), (queue,))
            return int(cur.rowcount)

    # -- workers ---------------------------------------------------------------------------

    def workers(self) -> list[WorkerReport]:
        def run(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            cur.execute(self._sql.FORGET_REPORTS)
            return cur.execute(
                self._q("SELECT deadline, record FROM {s}.worker_reports ORDER BY worker_id")
            ).fetchall()

        rows = self._run("reading the workers' reports", run)
        return [r for d, raw in rows if (r := decode_report(bytes(raw), d)) is not None]

    def totals(self) -> list[TaskCounts]:
        with self._cursor("reading the totals") as cur:
            rows = cur.execute(
                self._q("SELECT * FROM {s}.worker_totals ORDER BY queue, task")
            ).fetchall()
        return [TaskCounts(r[0], r[1], *map(int, r[2:])) for r in rows]

    def _notify_ready(self, cur: psycopg.Cursor[Any], queues: Iterable[str]) -> None:
        names = sorted(set(queues))
        if names:
            cur.execute(self._sql.NOTIFY_MANY, (self._sql.ready_channel, payloads(names)))
