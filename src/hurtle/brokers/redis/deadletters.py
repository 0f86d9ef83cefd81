"""``RedisBroker``'s dead letters seen from the admin side: listing, finding one by message id,
deleting and purging; and the index of them by message id that the scripts keep.

The index (``keys.DEAD_INDEX``: message id -> queue and dead-letter id) lives outside every
queue, since who looks a dead letter up knows only the message id. On one server the queue
scripts that write or remove dead letters (``dead_letter.lua``, ``heartbeat.lua``,
``dead_delete.lua``) keep it in the same step. On a Redis Cluster it has a
slot of its own, which a queue's script may not touch: the scripts hand back what they would
have changed and ``_index_dead`` applies it right after, with ``dead_index.lua`` (one round trip
per call that changed something). That leaves a window of a cluster: a lookup in the moment
between the two finds nothing yet, and a client that dies in it leaves a dead letter that no
lookup finds (or an entry that names a dead letter gone, which a lookup reads as nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...message import message_id
from ..keys import DEAD_INDEX, queue_keys
from ..records import DeadLetter
from .scripts import _ScriptRunner, _Scripts


class _DeadLetters(_ScriptRunner):
    """Mixed into ``RedisBroker``."""

    _scripts: _Scripts
    _sharded: bool

    @property
    def _dead_index(self) -> str:
        """The index key the queue scripts write, or ``''`` when they cannot (a cluster)."""
        return "" if self._sharded else DEAD_INDEX

    def _index_dead(self, changes: Sequence[Any], doing: str) -> None:
        """Apply what scripts handed back for the index (``'+'|'-'``, message id, entry, ...)."""
        if changes:
            self._eval(self._scripts.dead_index, (DEAD_INDEX,), list(changes), doing)

    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        k = queue_keys(queue)
        flat = self._eval(
            self._scripts.dead_list,
            (k.dead, k.dead_raw, k.dead_reason),
            (offset, limit),
            f"listing dead letters of {queue!r}",
        )
        return [
            DeadLetter(
                id=flat[i].decode(),
                queue=queue,
                failed_at=float(flat[i + 1]),
                reason=flat[i + 2].decode("utf-8", "replace"),
                raw=flat[i + 3],
            )
            for i in range(0, len(flat), 4)
        ]

    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        doing = f"looking up the dead letter of message {message_id!r}"
        [entry] = self._pipeline([(("HGET", DEAD_INDEX, message_id), None)], doing)
        if entry is None:
            return None
        queue, _, id_ = entry.decode().partition("\x1f")
        k = queue_keys(queue)
        failed_at, raw, reason = self._pipeline(
            [
                (("ZSCORE", k.dead, id_), None),
                (("HGET", k.dead_raw, id_), None),
                (("HGET", k.dead_reason, id_), None),
            ],
            doing,
        )
        if raw is None or failed_at is None or _message_id(raw) != message_id:
            return None  # an entry a cluster left behind (see the module doc)
        return DeadLetter(
            id=id_,
            queue=queue,
            reason=(reason or b"").decode("utf-8", "replace"),
            raw=raw,
            failed_at=float(failed_at),
        )

    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        k = queue_keys(queue)
        doing = f"deleting dead letters of {queue!r}"
        n, *changes = self._eval(
            self._scripts.dead_delete,
            (k.dead, k.dead_raw, k.dead_reason),
            [self._dead_index, queue, "", *ids],
            doing,
        )
        self._index_dead(changes, doing)
        return int(n)

    def _stored_purge_dead(self, queue: str) -> int:
        k = queue_keys(queue)
        doing = f"purging dead letters of {queue!r}"
        n, *changes = self._eval(
            self._scripts.dead_delete,
            (k.dead, k.dead_raw, k.dead_reason),
            (self._dead_index, queue, "*"),
            doing,
        )
        self._index_dead(changes, doing)
        return int(n)


def _message_id(raw: bytes) -> str:
    return message_id(bytes(raw))
