"""``SQLiteBroker``'s dead letters: reading, deleting and purging them, and trimming a queue's."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from ..records import DeadLetter
from .connection import _Connection
from .schema import _CAP_DEAD, _EXPIRE_DEAD, _IDS


class _DeadLetters(_Connection):
    """``SQLiteBroker``'s dead-letter operations."""

    dead_letter_max: int
    dead_letter_ttl: float

    def _trim_dead(self, conn: sqlite3.Connection, queue: str, now: float) -> tuple[int, int]:
        """Drop dead letters past the ttl, then the oldest beyond the cap; (expired, dropped)."""
        expired = dropped = 0
        if self.dead_letter_ttl:
            expired = conn.execute(_EXPIRE_DEAD, (queue, now - self.dead_letter_ttl)).rowcount
        if self.dead_letter_max:
            dropped = conn.execute(_CAP_DEAD, (queue, self.dead_letter_max)).rowcount
        return expired, dropped

    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT id, queue, reason, body, failed_at FROM dead WHERE queue = ? "
                "ORDER BY seq LIMIT ? OFFSET ?",
                (queue, limit, offset),
            ).fetchall()
        return [
            DeadLetter(id=r[0], queue=r[1], reason=r[2], raw=r[3], failed_at=r[4]) for r in rows
        ]

    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        with self._read() as conn:  # the dead_message index; the latest dead letter first
            r = conn.execute(
                "SELECT id, queue, reason, body, failed_at FROM dead WHERE message_id = ? "
                "ORDER BY seq DESC LIMIT 1",
                (message_id,),
            ).fetchone()
        if r is None:
            return None
        return DeadLetter(id=r[0], queue=r[1], reason=r[2], raw=r[3], failed_at=r[4])

    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        with self._write() as conn:
            deleted: int = conn.execute(
                f"DELETE FROM dead WHERE queue = ? AND id IN ({_IDS})",
                (queue, json.dumps(list(ids))),
            ).rowcount
        return deleted

    def _stored_purge_dead(self, queue: str) -> int:
        with self._write() as conn:
            deleted: int = conn.execute("DELETE FROM dead WHERE queue = ?", (queue,)).rowcount
        return deleted
