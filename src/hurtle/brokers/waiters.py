"""Result waiters by message id, for the brokers that can notify (``Broker.watch_results``): a
listener thread of the broker's calls ``wake`` with the ids a notification names (or ``None``
for every waiter, after it (re)subscribed). Safe across threads; a forked child starts empty
(the parent's listener and waiters stayed behind). ``watch`` is how a waiter is added, also by
the memory broker, which keeps its waiters under its own lock."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence


def watch(
    lock: threading.Lock,
    by_id: dict[str, list[Callable[[], None]]],
    ids: Sequence[str],
    wake: Callable[[], None],
) -> Callable[[], None]:
    """Add ``wake`` to the waiters of each of ``ids`` in ``by_id``, which ``lock`` guards;
    returns the function that removes it again (a second call removes nothing)."""
    with lock:
        for id_ in ids:
            by_id.setdefault(id_, []).append(wake)

    def stop() -> None:
        with lock:
            for id_ in ids:
                watchers = by_id.get(id_)
                if watchers is not None:
                    with contextlib.suppress(ValueError):
                        watchers.remove(wake)
                    if not watchers:
                        del by_id[id_]

    return stop


class Waiters:
    """The registry: ``add`` returns the function that removes what it added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, list[Callable[[], None]]] = {}
        self._pid = os.getpid()

    def add(self, ids: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        if self._pid != os.getpid():  # forked: any lock holder stayed behind
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._by_id = {}
        return watch(self._lock, self._by_id, ids, wake)

    def wake(self, ids: Iterable[str] | None) -> None:
        """Call the waiters of ``ids`` (of every id when None), outside the lock."""
        with self._lock:
            if ids is None:
                wakes = [w for ws in self._by_id.values() for w in ws]
            else:
                wakes = [w for id_ in ids for w in self._by_id.get(id_, ())]
        for wake in wakes:
            wake()
