"""One thread per broker object on a connection of its own, ``LISTEN``ing while anyone waits:
it wakes idle consumers when their queues get work, and result waiters when their ids are stored.

Consumers wait on a ticket per queue: every notification naming a queue bumps its ticket, and a
consumer that saw its tickets move claims again. Each (re)subscription bumps every ticket and
wakes every result waiter, so that nothing announced before the ``LISTEN`` took effect is
missed; a notification lost with a connection costs a consumer at most ``POLL_INTERVAL`` (it
claims again then, whatever it heard). A forked child starts a listener of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from ..waiters import Waiters

if TYPE_CHECKING:
    from .connection import _Connection

log = logging.getLogger(__name__)

#: Seconds an idle consumer waits at most before it claims again, notified or not.
POLL_INTERVAL = 1.0
#: Bytes of one notification's payload (the server takes up to 8,000).
PAYLOAD_MOST = 7000


def payloads(names: Iterable[str]) -> list[str]:
    """``names`` one a line, cut into payloads that fit a notification."""
    out: list[str] = []
    part: list[str] = []
    size = 0
    for name in names:
        if part and size + len(name) + 1 > PAYLOAD_MOST:
            out.append("\n".join(part))
            part, size = [], 0
        part.append(name)
        size += len(name.encode()) + 1
    if part:
        out.append("\n".join(part))
    return out


class Listener:
    """The notifications of one broker object (see the module)."""

    def __init__(self, owner: _Connection) -> None:
        self._owner = owner
        self._wake = threading.Condition(threading.Lock())
        self._tickets: dict[str, int] = {}
        self._all = 0  # bumped by every (re)subscription
        self._waiters = Waiters()
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._closed = False
        self._pid = os.getpid()

    # -- consumers -----------------------------------------------------------------------

    def ticket(self, queues: Sequence[str]) -> int:
        """A number that changes whenever one of ``queues`` may have got work."""
        self._start()
        return self._count(queues)

    def _count(self, queues: Sequence[str]) -> int:
        tickets = self._tickets
        return self._all + sum(tickets.get(q, 0) for q in queues)

    def wait(self, queues: Sequence[str], ticket: int, seconds: float) -> bool:
        """Wait up to ``seconds`` for the ticket of ``queues`` to move; True when it did."""
        with self._wake:
            if self._count(queues) != ticket:
                return True
            self._wake.wait(seconds)
            return self._count(queues) != ticket

    def bump(self, queues: Iterable[str]) -> None:
        """Work came to ``queues`` through this process: wake its waiters now."""
        with self._wake:
            for q in queues:
                self._tickets[q] = self._tickets.get(q, 0) + 1
            self._wake.notify_all()

    # -- result waiters ------------------------------------------------------------------

    def watch(self, ids: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        stop = self._waiters.add(ids, wake)
        self._start()
        return stop

    # -- the thread ----------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._wake:
            if self._pid != os.getpid():  # forked: the thread stayed with the parent
                self._pid = os.getpid()
                self._thread = None
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="hurtle-postgres-listener", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        sql = self._owner._sql
        ready, results = sql.ready_channel, sql.results_channel
        backoff = 0.1
        while not self._closed:
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self._owner.connect()
                conn.execute(f'LISTEN "{ready}"')
                conn.execute(f'LISTEN "{results}"')
                self._resubscribed()
                backoff = 0.1
                while not self._closed:
                    for note in conn.notifies(timeout=POLL_INTERVAL):
                        names = note.payload.split("\n")
                        if note.channel == ready:
                            self.bump(names)
                        else:
                            self._waiters.wake(names)
                    if conn.closed:
                        raise psycopg.OperationalError("the connection was closed")
            except Exception as err:  # psycopg's errors, or a connection lost mid-read
                if self._closed:
                    break
                log.warning(
                    "lost the notifications of PostgreSQL at %s (%s); listening again in %.1fs",
                    self._owner.url,
                    " ".join(str(err).split()),
                    backoff,
                )
                self._resubscribed()  # waiters look again meanwhile
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def _resubscribed(self) -> None:
        with self._wake:
            self._all += 1
            self._wake.notify_all()
        self._listening.set()
        self._waiters.wake(None)

    def close(self) -> None:
        """Stop: the thread ends at its next timeout, and closes its connection."""
        self._closed = True
        with self._wake:
            self._wake.notify_all()
