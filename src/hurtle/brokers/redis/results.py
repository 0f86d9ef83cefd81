"""Results: the commands that store a batch's records, and the listener that wakes waiters.

Records are kept per bucket: a run of ids that differ only in their last ``RESULT_BUCKET_CUT``
bytes (``keys.result_key``). A worker's batch of 32 or more calls that returned comes as one
value (``ResultBatch``: ``records.Batch``), stored whole as one field of the bucket's hash of
batches (``keys.result_batches_key``), named by the batch's first and last id in the bucket and
holding its ids: the worker neither makes nor sends a record per call, and Redis keeps one
field per batch. ``result_get.lua`` finds an id in a batch's list of ids and the broker rebuilds
the call's record from the batch (``records.record_in_batch``), the bytes a record stored on
its own would have. Any other record (a failed attempt's, a dead
letter's, a small batch's) is a field of the bucket's hash of records, one per id.

A worker's records ride with its acknowledgements: on one server they are written by the
acknowledgement's script (``ack_results.lua``), only for the batches the worker still holds, so
that a worker taken for dead does not replace the records of the copies delivered again; the
worker packs the script's arguments as it would a plain ``HSET`` (``_pairs``). A script pays
for its arguments: Redis stores a record one by one for about 1.3 µs of its time that way,
against 0.17 µs for a plain ``HSET`` (``INFO commandstats``, 1,000 records of 150 bytes a
batch); a batch stored whole is one field for 64 records, whatever the form. Records that ride
with no delivery (a failed attempt's, a dead letter's), and on a cluster those whose batches
were found held just before (``cluster.py``), are written by plain commands: per hash they
touch, one ``results_expire.lua`` call, which gives the hash its expiry before anything is in
it, and one ``HSET``; then one announcement of the ids, in the acknowledgements' pipeline. Each
value starts with its own expiry, 13 digits of milliseconds on the server's clock, which
``result_get.lua`` checks (a hash lives as long as its longest-lived value); the worker
reckons it from its own clock corrected by the server's (``RedisBroker._server_ms``, read
again every ``CLOCK_CHECK_EVERY`` seconds).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, groupby, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from ..columns import ResultBatch, StoredResults
from ..keys import (
    RESULT_BATCHES_SUFFIX,
    RESULT_BUCKET_CUT,
    RESULT_KEY_PREFIX,
    RESULTS_CHANNEL,
    result_key,
)
from ..records import StoredResult
from ..waiters import Waiters
from .scripts import RAW, _Command, _pack

if TYPE_CHECKING:
    from .broker import RedisBroker

log = logging.getLogger(__name__)

_FIRST = itemgetter(0)

#: Seconds between two readings of the server's clock by one broker object (records carry
#: their expiry in the server's milliseconds).
CLOCK_CHECK_EVERY = 60.0


class _Write(NamedTuple):
    """The records of one batch bound for one hash: ``size`` fields, as the arguments of an
    ``HSET`` after its key (``body``: the RESP bulk strings, packed here, or the arguments),
    the longest time to live among them in ms."""

    name: str | bytes
    ttl_ms: int
    size: int
    body: bytes | list[Any]


def _results_commands(broker: RedisBroker, results: Sequence[StoredResult]) -> list[_Command]:
    """Per hash of results touched (most batches touch one): one ``results_expire.lua`` call,
    which gives the hash its expiry (making it first if need be), then one ``HSET`` of its
    records (batches stored whole: ``_batch_writes``); then one ``PUBLISH`` (``SPUBLISH``
    on a cluster) of the batch's ids. Each command names one key, so on a cluster each goes to
    its slot. Records in columns (``StoredResults``, what a worker's batch makes) are read as
    they are. These records are written whatever holds their messages: records that ride
    with no delivery, or whose deliveries were found held just before (``cluster.py``); on
    one server a worker's records ride in its acknowledgement's script (``ack_results.lua``).
    """
    if not results:
        return []
    writes, announced = _writes(broker, results, broker._server_ms())
    announce = "SPUBLISH" if broker._sharded else "PUBLISH"
    expire = broker._scripts.results_expire
    commands: list[_Command] = []
    for w in writes:
        commands.append(broker._call_whole(expire, (w.name,), (w.ttl_ms,)))
        if isinstance(w.body, bytes):
            commands.append(((RAW, _head(("HSET", w.name), 2 * w.size) + w.body), None))
        else:
            commands.append((("HSET", w.name, *w.body), None))
    commands.append(((announce, RESULTS_CHANNEL, announced), None))
    return commands


def _writes(
    broker: RedisBroker, results: Sequence[StoredResult], now_ms: int
) -> tuple[list[_Write], str]:
    """The records as writes, one per hash touched (two for a bucket that gets batches stored
    whole and records one by one), and the ids to announce, space-separated."""
    if isinstance(results, StoredResults):
        ids, ttls = results.ids, [results.ttl]
        announced = " ".join(ids)
        runs = _runs(ids, announced, RESULT_BUCKET_CUT)
        batches = results.batches
        if batches is not None and runs is not None and broker._raw_ok:
            return _batch_writes(ids, runs, batches, results.ttl, now_ms), announced
        payloads = results.payloads
    else:
        ids = [r.id for r in results]
        payloads = [r.payload for r in results]
        ttls = [r.ttl for r in results]
        if ttls.count(ttls[0]) == len(ttls):
            ttls = ttls[:1]
        announced = " ".join(ids)
        runs = _runs(ids, announced, RESULT_BUCKET_CUT)
    # hash name -> (ids, payloads, ttls: one for all, or one each)
    groups: dict[str | bytes, tuple[list[str], list[bytes], list[float]]] = {}
    if runs is not None:  # a worker's batch: ids of one publisher, in order
        one_ttl = len(ttls) == 1
        for bucket, start, end in runs:
            groups[f"{RESULT_KEY_PREFIX}{bucket}}}"] = (
                ids[start:end] if len(runs) > 1 else ids,
                payloads[start:end] if len(runs) > 1 else payloads,
                ttls if one_ttl else ttls[start:end],
            )
    else:
        every_ttl = ttls if len(ttls) > 1 else repeat(ttls[0])
        # a bucket is cut in bytes: str slices are bytes when the ids are ASCII
        cut = RESULT_BUCKET_CUT
        buckets: Iterable[str | bytes] = (
            [f"{RESULT_KEY_PREFIX}{i[:-cut]}}}" for i in ids]  # "" for ids of <= ``cut``
            if announced.isascii()
            else map(result_key, ids)
        )
        rows_of = zip(buckets, ids, payloads, every_ttl, strict=False)  # the ttl may repeat
        for name, run in groupby(rows_of, _FIRST):
            rows = list(run)
            group = groups.get(name)
            if group is None:
                group = groups[name] = ([], [], [])
            group[0].extend([row[1] for row in rows])
            group[1].extend([row[2] for row in rows])
            group[2].extend([row[3] for row in rows])
    stamps: dict[float, bytes] = {}  # ttl -> the 13-digit expiry that leads each value
    writes: list[_Write] = []
    # ids of one length, ASCII, no spaces: the HSET can be packed here (``_pairs``)
    pack_here = runs is not None and broker._raw_ok
    for name, (group_ids, group_payloads, group_ttls) in groups.items():
        ttl = group_ttls[0]
        n = len(group_ids)
        if group_ttls.count(ttl) == len(group_ttls):
            stamp = stamps.get(ttl) or stamps.setdefault(ttl, _stamp(now_ms, ttl))
            if pack_here:
                writes.append(
                    _Write(name, _ttl_ms(ttl), n, _pairs(group_ids, group_payloads, stamp))
                )
                continue
            values = [stamp + p for p in group_payloads]
        else:
            ttl = max(group_ttls)
            values = [
                (stamps.get(t) or stamps.setdefault(t, _stamp(now_ms, t))) + p
                for t, p in zip(group_ttls, group_payloads, strict=True)
            ]
        fields: list[Any] = [None] * (2 * n)
        fields[0::2] = group_ids
        fields[1::2] = values
        writes.append(_Write(name, _ttl_ms(ttl), n, fields))
    return writes, announced


def _batch_writes(
    ids: list[str],
    runs: list[tuple[str, int, int]],
    batches: list[ResultBatch],
    ttl: float,
    now_ms: int,
) -> list[_Write]:
    """Batches of records stored whole: per bucket they have ids in, one write to the
    bucket's hash of batches of each batch under the first and last of its ids in the bucket.
    The value: the expiry, the length of the batch's ids, its ids (space-separated), its body
    (``result_get.lua`` reads it). A batch whose ids span two buckets is stored in both. A
    batch with no body (too small to be kept whole) is stored one record per field, as
    ``_writes`` does."""
    stamp = _stamp(now_ms, ttl)
    ttl_ms = _ttl_ms(ttl)
    starts = list(accumulate((b.size for b in batches), initial=0))
    heads: list[bytes] = []  # per batch: the value up to its body
    loose: list[list[bytes]] = []  # per batch: its records, when it has no body
    for b, start in zip(batches, starts, strict=False):
        if b.body:
            listed = " ".join(ids[start : start + b.size]).encode()
            heads.append(b"%s%08d%s" % (stamp, len(listed), listed))
            loose.append([])
        else:
            heads.append(b"")
            loose.append(b.payloads())
    writes: list[_Write] = []
    for bucket, start, end in runs:
        name = f"{RESULT_KEY_PREFIX}{bucket}}}"
        parts: list[bytes] = []
        fields = 0
        one_ids: list[str] = []  # records one by one, in the bucket's hash of records
        one_payloads: list[bytes] = []
        for b, head, records, first, after in zip(
            batches, heads, loose, starts, starts[1:], strict=False
        ):
            low, high = max(start, first), min(end, after)
            if low >= high:
                continue
            if not b.body:
                one_ids += ids[low:high]
                one_payloads += records[low - first : high - first]
                continue
            field = f"{ids[low]} {ids[high - 1]}".encode()
            parts += [
                b"$%d\r\n%s\r\n$%d\r\n" % (len(field), field, len(head) + len(b.body)),
                head,
                b.body,
                b"\r\n",
            ]
            fields += 1
        if fields:
            whole = f"{name}{RESULT_BATCHES_SUFFIX}".encode()
            writes.append(_Write(whole, ttl_ms, fields, b"".join(parts)))
        if one_ids:
            writes.append(_Write(name, ttl_ms, len(one_ids), _pairs(one_ids, one_payloads, stamp)))
    return writes


def _head(args: Sequence[Any], more: int) -> bytes:
    """The RESP of a command's first arguments, ``args``, announcing ``more`` bulk strings
    after them (packed here: ``_pairs``)."""
    assert _pack is not None
    packed = _pack(tuple(args))
    return b"*%d\r\n%s" % (len(args) + more, packed[packed.index(b"\r\n") + 2 :])


def _hset(key: str, ids: list[str], payloads: list[bytes], stamp: bytes) -> bytes:
    """The RESP bytes of ``HSET key id stamp+payload ...`` (``_pairs``)."""
    return _head(("HSET", key), 2 * len(ids)) + _pairs(ids, payloads, stamp)


def _pairs(ids: list[str], payloads: list[bytes], stamp: bytes) -> bytes:
    """The RESP bulk strings ``id stamp+payload ...``, for ASCII ids of one length without
    spaces: made with a few slices and one join, no Python step per record. About 1,500 CPU
    instructions a record (callgrind, 1,000 records of 70 bytes), where hiredis, after a
    concatenation per value for the stamp, takes 3,900."""
    n = len(ids)
    raw_ids = " ".join(ids).encode().split(b" ")
    id_head = b"\r\n$%d\r\n" % len(raw_ids[0])
    lengths = list(map(len, payloads))
    # payload length -> the value's header, then the stamp (a batch's records have few lengths)
    heads = {k: b"\r\n$%d\r\n%s" % (k + len(stamp), stamp) for k in set(lengths)}
    # per record: the id's header, the id, the value's header, the payload (each header but
    # the first starts by ending the line before it); then the last line end
    parts = [id_head] * (4 * n + 1)
    parts[0] = id_head[2:]
    parts[1::4] = raw_ids
    parts[2::4] = map(heads.__getitem__, lengths)
    parts[3::4] = payloads
    parts[-1] = b"\r\n"
    return b"".join(parts)


def _runs(ids: list[str], announced: str, cut: int) -> list[tuple[str, int, int]] | None:
    """The runs of ``ids`` that share a bucket, as (bucket, start, end), when the ids are
    ASCII, all of one length and in order (``announced`` is them joined by single spaces): a
    worker's batch, consecutive ids of one publisher, whose runs a binary search per run finds
    without a look at every id. None otherwise."""
    n, size = len(ids), len(ids[0])
    if size <= cut or not announced.isascii():
        return None
    if len(announced) != n * (size + 1) - 1 or announced.count(" ") != n - 1:
        return None
    if n > 1 and announced[size :: size + 1].count(" ") != n - 1:
        return None  # the spaces are not where ids of one length put them
    if ids != sorted(ids):
        return None
    runs = []
    start = 0
    top = "\x7f" * cut  # above any ASCII: ids of one bucket sort at or below bucket + top
    while start < n:
        bucket = ids[start][:-cut]
        end = bisect_right(ids, bucket + top, start)
        runs.append((bucket, start, end))
        start = end
    return runs


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
        self._waiters = Waiters()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    def watch(self, ids: Sequence[str], wake: Callable[[], None]) -> Callable[[], None]:
        if self._pid != os.getpid():  # forked: the thread and any lock holder stayed behind
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._thread = None
        stop = self._waiters.add(ids, wake)
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="hurtle-results", daemon=True
                )
                self._thread.start()

        return stop

    def _wake(self, ids: Iterable[str] | None) -> None:
        self._waiters.wake(ids)

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
