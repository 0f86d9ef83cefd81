"""A queue as its user names it, for purging and for its dead letters: the queue with the
sub-queues of its fair keys (``hurtle.fair``).

A fair task's call of key ``k`` waits in ``names.fair_queue(q, k)`` (``q~f<hash>``), a queue
of the broker's own, and a key's session settles it there: a call that ends as a dead letter
is stored among the sub-queue's dead letters, in the same step of the store as its
settlement (on Redis, in the sub-queue's hash tag: a Redis Cluster could not move it to
``q``'s in that step). A user names ``q``. So ``Broker``'s admin side, mixed in from here,
takes ``q`` to mean ``q`` and its keys' sub-queues that the broker lists (``Broker.queues``):

* ``purge(q)`` drops the waiting messages of ``q`` and of each of its keys' sub-queues and
  counts them all (one step of the store where it takes a list of queues in one: memory,
  SQLite, PostgreSQL; one pipelined round trip of a script per queue on Redis, one step per
  queue on NATS);
* ``dead_letters(q)``, ``delete_dead(q, ...)``, ``purge_dead(q)`` (and so ``retry_dead(q)``)
  reach the dead letters of ``q`` and of its keys' sub-queues that hold any
  (``Broker.stats``' ``dead``), the list merged oldest first; every dead letter read
  (``find_dead`` too) names ``q``, the queue it was sent to, while its message keeps the
  sub-queue: retried, it goes back to its key's sub-queue, and fairness holds.

A broker implements the ``_stored_*`` methods, each on one queue it stores (or a list of them
for ``_stored_purge``); the public ones here are the contract's (``base.py``). A dead letter's
cap (``dead_letter_max``) and ttl still hold per stored queue: each key's sub-queue keeps at
most that many.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from operator import attrgetter

import msgspec

from ..names import FAIR_MARK, check_stored_queue_name, fair_parent
from .records import DeadLetter, QueueStats

_FAILED_AT = attrgetter("failed_at")


class FairAdmin(abc.ABC):
    """Mixed into ``Broker``: purge and the dead letters of a queue with its keys' sub-queues."""

    @abc.abstractmethod
    def queues(self) -> list[str]: ...

    @abc.abstractmethod
    def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]: ...

    # -- what a broker implements, on the queues it stores ----------------------------------

    def _stored_purge(self, queues: Sequence[str]) -> int:
        """Drop every message of these stored queues waiting to be fetched (``purge``); in one
        step where the store can; returns how many."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot purge a queue's waiting messages: its purge is missing"
        )

    @abc.abstractmethod
    def _stored_dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        """Dead letters stored under ``queue``, oldest first."""

    @abc.abstractmethod
    def _stored_find_dead(self, message_id: str) -> DeadLetter | None:
        """``find_dead``, naming the queue that stores the dead letter."""

    @abc.abstractmethod
    def _stored_delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        """Remove these dead letters stored under ``queue``; returns how many existed."""

    @abc.abstractmethod
    def _stored_purge_dead(self, queue: str) -> int:
        """Remove every dead letter stored under ``queue``; returns how many there were."""

    # -- the contract's admin side ---------------------------------------------------------

    def purge(self, queue: str) -> int:
        """Drop every message of ``queue`` waiting to be fetched (ready, delayed, and recovered
        ones waiting to be let out), its fair keys' sub-queues' included; returns how many.

        What workers hold (in flight) finishes as usual, dead letters stay (``purge_dead``),
        and unique locks of dropped messages are kept until they expire.
        """
        check_stored_queue_name(queue)
        return self._stored_purge([queue, *self.fair_keys_of(queue)])

    def dead_letters(self, queue: str, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        """Dead letters of ``queue`` (its fair keys' sub-queues' included), oldest first."""
        keys = self._keys_with_dead(queue)
        if not keys:
            return [_filed(d) for d in self._stored_dead_letters(queue, limit, offset)]
        merged = [
            d for name in (queue, *keys) for d in self._stored_dead_letters(name, limit + offset, 0)
        ]
        merged.sort(key=_FAILED_AT)
        return [_filed(d) for d in merged[offset : offset + limit]]

    def find_dead(self, message_id: str) -> DeadLetter | None:
        """The dead letter of the message ``message_id``, whatever its queue, or None: one read
        of an index (message id -> queue and dead letter) that each dead-letter write and
        removal keeps in the same step, not a search through queues. Bytes that are not a
        message have no id and are not indexed; a message dead-lettered more than once is
        found by its latest dead letter."""
        found = self._stored_find_dead(message_id)
        return None if found is None else _filed(found)

    def delete_dead(self, queue: str, ids: Sequence[str]) -> int:
        """Remove these dead letters of ``queue``; returns how many existed."""
        if not ids:
            return 0
        return sum(self._stored_delete_dead(n, ids) for n in (queue, *self._keys_with_dead(queue)))

    def purge_dead(self, queue: str) -> int:
        """Remove every dead letter of ``queue``; returns how many there were."""
        return sum(self._stored_purge_dead(n) for n in (queue, *self._keys_with_dead(queue)))

    # -- the keys ---------------------------------------------------------------------------

    def fair_keys_of(self, queue: str) -> list[str]:
        """The sub-queues of ``queue``'s fair keys that this broker lists."""
        if FAIR_MARK in queue:  # a key's sub-queue (or a shard's) has no keys of its own
            return []
        prefix = queue + FAIR_MARK
        return [n for n in self.queues() if n.startswith(prefix) and fair_parent(n) == queue]

    def _keys_with_dead(self, queue: str) -> list[str]:
        """The sub-queues of ``queue``'s fair keys that hold dead letters."""
        keys = self.fair_keys_of(queue)
        if not keys:
            return keys
        return [name for name, s in self.stats(keys).items() if s.dead]


def _filed(dead: DeadLetter) -> DeadLetter:
    """``dead`` naming the queue its message was sent to, not its key's sub-queue (the
    message's bytes keep the sub-queue: a retry puts it back there)."""
    queue = fair_parent(dead.queue) if FAIR_MARK in dead.queue else None
    return dead if queue is None else msgspec.structs.replace(dead, queue=queue)
