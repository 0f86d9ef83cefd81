"""Results: the commands that store a batch's records, and the listener that wakes waiters.

A batch of records is one ``results.lua`` call per distinct ttl (most batches have one) whose
ids and values come packed in a few strings: the worker's share of the work is a few joins
per batch, which matters more than the server's (the worker's thread is the one that is
busy). Each value starts with the record's own expiry, 13 digits of milliseconds on the
server's clock, which ``result_get.lua`` checks; the worker reckons it from its own clock
corrected by the server's (``RedisBroker._server_ms``, read again every ``CLOCK_CHECK_EVERY``
seconds), and puts it in front of each payload with one join per batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..base import StoredResult
from ..keys import RESULT_BUCKET_CUT, RESULT_KEY_PREFIX, RESULTS_CHANNEL, result_key
from .scripts import _Command, _packed

if TYPE_CHECKING:
    from .broker import RedisBroker

log = logging.getLogger(__name__)

#: Seconds between two readings of the server's clock by one broker object (records carry
#: their expiry in the server's milliseconds).
CLOCK_CHECK_EVERY = 60.0


def _results_commands(broker: RedisBroker, results: Sequence[StoredResult]) -> list[_Command]:
    """One ``results.lua`` call per distinct ttl, announcing the batch's ids; on a cluster, one
    per hash of results (per slot) and ttl, none announcing, then one ``SPUBLISH``."""
    now_ms = broker._server_ms()
    if broker._sharded:
        groups: dict[tuple[float, bytes], list[StoredResult]] = {}
        for r in results:
            groups.setdefault((r.ttl, result_key(r.id)), []).append(r)
        commands = [
            _results_call(broker, group, ttl, (key,), "", now_ms)
            for (ttl, key), group in groups.items()
        ]
        commands.append((("SPUBLISH", RESULTS_CHANNEL, " ".join(r.id for r in results)), None))
        return commands
    by_ttl: dict[float, list[StoredResult]] = {}
    for r in results:
        group = by_ttl.get(r.ttl)
        if group is None:
            by_ttl[r.ttl] = [r]
        else:
            group.append(r)
    return [
        _results_call(broker, group, ttl, (), RESULTS_CHANNEL, now_ms)
        for ttl, group in by_ttl.items()
    ]


def _results_call(
    broker: RedisBroker,
    group: Sequence[StoredResult],
    ttl: float,
    keys: Sequence[Any],
    channel: str,
    now_ms: int,
) -> _Command:
    ttl_ms = max(int(ttl * 1000), 1)
    stamp = b"%013d" % (now_ms + ttl_ms)
    id_list = [r.id for r in group]
    ids, packed_ids = _packed(id_list)
    payloads = [r.payload for r in group]
    lengths = [0] * (2 * len(group))
    lengths[0::2] = map(len, ids)
    lengths[1::2] = map(len, payloads)
    return broker._call(
        broker._scripts.results,
        keys,
        [
            channel,
            " ".join(id_list),
            ttl_ms,
            RESULT_KEY_PREFIX,
            RESULT_BUCKET_CUT,
            packed_ids,
            stamp + stamp.join(payloads),  # each payload after its stamp
            struct.pack(f"<{len(lengths)}I", *lengths),
        ],
    )


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
