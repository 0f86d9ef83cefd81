"""Results: the commands that store a batch's records, and the listener that wakes waiters.

Records are fields of hashes, one per run of ids that differ only in their last
``RESULT_BUCKET_CUT`` bytes (``keys.result_key``): a batch of records is one plain ``HSET``
per hash it touches (most batches touch one), one ``results_expire.lua`` call per hash, and
one announcement of the ids, sent with the batch's acknowledgements in one pipeline. Plain
commands, not a script that splits packed strings: Redis stores a record for about 0.35 µs of
its time that way, against 1.1 µs in Lua (measured with ``INFO commandstats``, 1,000 records
of 150 bytes a batch), and the worker's share, one argument list per hash that hiredis packs,
stays a few hundred nanoseconds a record. Each value starts with the record's own expiry, 13
digits of milliseconds on the server's clock, which ``result_get.lua`` checks (a hash lives as
long as its longest-lived record); the worker reckons it from its own clock corrected by the
server's (``RedisBroker._server_ms``, read again every ``CLOCK_CHECK_EVERY`` seconds).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ..base import StoredResult
from ..keys import RESULT_BUCKET_CUT, RESULT_KEY_PREFIX, RESULTS_CHANNEL, result_key
from .scripts import _Command

if TYPE_CHECKING:
    from .broker import RedisBroker

log = logging.getLogger(__name__)

_FIRST = itemgetter(0)

#: Seconds between two readings of the server's clock by one broker object (records carry
#: their expiry in the server's milliseconds).
CLOCK_CHECK_EVERY = 60.0


def _results_commands(broker: RedisBroker, results: Sequence[StoredResult]) -> list[_Command]:
    """Per hash of results touched (most batches touch one): one ``HSET`` of its records and
    one ``results_expire.lua`` call; then one ``PUBLISH`` (``SPUBLISH`` on a cluster) of the
    batch's ids. Each command names one key, so on a cluster each goes to its slot."""
    if not results:
        return []
    now_ms = broker._server_ms()
    ids = [r.id for r in results]
    announced = " ".join(ids)
    groups: dict[str | bytes, Sequence[StoredResult]]
    if not announced.isascii():  # a bucket is cut in bytes: let result_key cut it
        groups = {}
        for r in results:
            groups.setdefault(result_key(r.id), []).append(r)  # type: ignore[attr-defined]
    else:
        cut = RESULT_BUCKET_CUT
        first = ids[0][: max(len(ids[0]) - cut, 0)]
        if _one_bucket(announced, len(ids), len(first) + cut, len(first)):  # the usual
            groups = {f"{RESULT_KEY_PREFIX}{first}}}": results}
        else:  # runs of one bucket, as consecutive ids come: one dict lookup a run
            groups = {}
            buckets = [i[:-cut] for i in ids]  # "" for ids of up to ``cut`` bytes
            for bucket, run in groupby(zip(buckets, results, strict=True), _FIRST):
                name = f"{RESULT_KEY_PREFIX}{bucket}}}"
                group = groups.get(name)
                if group is None:
                    groups[name] = [r for _, r in run]
                else:
                    group.extend(r for _, r in run)  # type: ignore[attr-defined]
    stamps: dict[float, bytes] = {}  # ttl -> the 13-digit expiry that leads each value
    commands: list[_Command] = []
    expire = broker._scripts.results_expire
    for key, group in groups.items():
        ttl = group[0].ttl
        if all(r.ttl == ttl for r in group):
            stamp = stamps.get(ttl) or stamps.setdefault(ttl, _stamp(now_ms, ttl))
            values = [stamp + r.payload for r in group]
        else:
            ttl = max(r.ttl for r in group)
            values = [
                (stamps.get(r.ttl) or stamps.setdefault(r.ttl, _stamp(now_ms, r.ttl))) + r.payload
                for r in group
            ]
        fields: list[Any] = [None] * (2 * len(group))
        fields[0::2] = ids if group is results else [r.id for r in group]
        fields[1::2] = values
        commands.append((("HSET", key, *fields), None))
        commands.append(broker._call(expire, (key,), (_ttl_ms(ttl),)))
    announce = "SPUBLISH" if broker._sharded else "PUBLISH"
    commands.append(((announce, RESULTS_CHANNEL, announced), None))
    return commands


def _one_bucket(announced: str, n: int, size: int, prefix: int) -> bool:
    """Whether the ``n`` ids of ``announced`` (joined by single spaces) are all ``size``
    characters long and share their first ``prefix``: tested a column at a time (one slice
    and one count each, in C), not an id at a time."""
    if len(announced) != n * (size + 1) - 1 or announced.count(" ") != n - 1:
        return False
    if n > 1 and announced[size :: size + 1].count(" ") != n - 1:
        return False  # the spaces are not where ids of one length put them
    for at in range(prefix):
        column = announced[at :: size + 1]
        if column.count(column[0]) != n:
            return False
    return True


def _ttl_ms(ttl: float) -> int:
    return max(int(ttl * 1000), 1)


def _stamp(now_ms: int, ttl: float) -> bytes:
    """The expiry that leads a stored value: 13 digits of the server's milliseconds."""
    return b"%013d" % (now_ms + _ttl_ms(ttl))


class _ResultListener:
    """One thread on one connection, subscribed to ``RESULTS_CHANNEL`` while anyone waits,
    waking the waiters of the ids each announcement names.

    Each (re)subscription wakes every waiter, so that one that started watching before the
    subscription took effect re-reads its record: nothing announced in between is missed. A
    forked child starts a listener of its own (the parent's thread did not come along).
    """

    def __init__(
        self,
        client: Any,
        url: str,
        *,
        sharded: bool = False,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._client = client
        self._url = url
        #: On a cluster: ``SSUBSCRIBE`` on the node serving the channel's slot.
        self._sharded = sharded
        #: Called after a lost subscription, before subscribing again (a cluster refreshes
        #: its map of slots: the node may have failed over).
        self._on_error = on_error
        self._lock = threading.Lock()
        self._watchers: dict[str, list[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    def watch(self, ids: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        if self._pid != os.getpid():  # forked: the thread and any lock holder stayed behind
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._watchers = {}
            self._thread = None
        with self._lock:
            for id_ in ids:
                self._watchers.setdefault(id_, []).append(wake)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="hurtle-results", daemon=True
                )
                self._thread.start()

        def stop() -> None:
            with self._lock:
                for id_ in ids:
                    watchers = self._watchers.get(id_)
                    if watchers is not None:
                        watchers.remove(wake)
                        if not watchers:
                            del self._watchers[id_]

        return stop

    def _wake(self, ids: Iterable[str] | None) -> None:
        with self._lock:
            if ids is None:
                wakes = [w for ws in self._watchers.values() for w in ws]
            else:
                wakes = [w for id_ in ids for w in self._watchers.get(id_, ())]
        for wake in wakes:
            wake()

    def _run(self) -> None:
        backoff = 0.1
        while not self._closed:
            pubsub = self._client.pubsub()
            try:
                if self._sharded:
                    pubsub.ssubscribe(RESULTS_CHANNEL)
                    read = pubsub.get_sharded_message
                else:
                    pubsub.subscribe(RESULTS_CHANNEL)
                    read = pubsub.get_message
                while not self._closed:
                    message = read(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] in ("message", "smessage"):
                        self._wake(message["data"].decode("ascii", "replace").split())
                    elif message["type"] in ("subscribe", "ssubscribe"):
                        self._wake(None)
                    backoff = 0.1
            except Exception as err:  # redis-py's errors, or its state after a disconnect
                if self._closed:
                    return
                log.warning(
                    "lost the result announcements of Redis at %s (%s); subscribing again in %.1fs",
                    self._url,
                    err,
                    backoff,
                )
                self._wake(None)  # waiters re-read meanwhile
                time.sleep(backoff)
                if self._on_error is not None:
                    with contextlib.suppress(Exception):
                        self._on_error()
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def close(self) -> None:
        """Stop; the thread ends at its next read, which the pool's disconnect cuts short."""
        self._closed = True
