"""Control: cancellations (a sorted set of ids by the end of each, and a flag per queue that
its fetch script reads), paused queues (a key per queue, read by the fetch script too) and
forgetting an empty queue (its name out of ``hurtle:queues``)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ...debounce import other_records, own_prefixes
from ..common import check_cancel_ttl, check_queue_name
from ..keys import CANCELLED, QUEUES, RESULT_BUCKET_CUT, progress_key, queue_keys
from ..records import QueueStats, StoredResult
from .scripts import _ScriptRunner, _Scripts


class _Control(_ScriptRunner):
    """``RedisBroker``'s side of cancellations and paused queues."""

    _scripts: _Scripts

    if TYPE_CHECKING:  # RedisBroker's

        def queues(self) -> list[str]: ...

        def stats(self, queues: Iterable[str] | None = None) -> dict[str, QueueStats]: ...

    def put_progress(self, reports: Sequence[StoredResult]) -> None:
        """One ``HSET`` and one ``PEXPIRE`` per bucket of ids (``keys.progress_key``), in one
        pipeline (a round trip per node of a cluster); each value is its expiry then the
        report. A worker's reports are mostly a few values with one ttl, of ids that share
        buckets: each value and each bucket's key is made once per call, not once per report,
        and every bucket is kept for the longest ttl."""
        if not reports:
            return
        now_ms = int(time.time() * 1000)
        values: dict[tuple[float, bytes], bytes] = {}
        # by the id's bucket (an ASCII id's head; any other id its own): the key, then fields
        buckets: dict[str, list[bytes | str]] = {}
        for r in reports:
            i = r.id
            value = values.get((r.ttl, r.payload))
            if value is None:
                expiry = now_ms + max(int(r.ttl * 1000), 1)
                value = values[(r.ttl, r.payload)] = b"%013d%s" % (expiry, r.payload)
            head = i[:-RESULT_BUCKET_CUT] if i.isascii() else i
            fields = buckets.get(head)
            if fields is None:
                fields = buckets[head] = [progress_key(i)]
            fields.append(i)
            fields.append(value)
        longest = max(max(int(ttl * 1000), 1) for ttl, _ in values)
        commands: list[Any] = []
        for fields in buckets.values():
            commands.append((("HSET", *fields), None))
            commands.append((("PEXPIRE", fields[0], longest, "GT"), None))
            commands.append((("PEXPIRE", fields[0], longest, "NX"), None))
        self._pipeline_raw(commands, f"storing {len(reports)} progress reports")

    def get_progress(self, ids: Sequence[str]) -> list[bytes | None]:
        if not ids:
            return []
        found = self._pipeline(
            [(("HGET", progress_key(i), i), None) for i in ids],
            f"reading {len(ids)} progress reports",
        )
        now_ms = int(time.time() * 1000)
        return [bytes(f[13:]) if f is not None and int(f[:13]) > now_ms else None for f in found]

    def put_latest(self, latest: Sequence[tuple[str, str, str]], ttl: float) -> None:
        """One ``latest_put.lua`` per queue (its keys share the queue's hash tag), all in one
        pipeline: a key of its own for each debounce key, so that each expires on its own.
        Each key in the order given, repeats too: a record that replaces another call's
        raises the queue's ``replaced`` flag, which spares workers their check while down."""
        if not latest:
            return
        by_queue: dict[str, tuple[list[str], list[str]]] = {}
        for queue, key, value in latest:
            found = by_queue.get(queue)
            if found is None:
                found = by_queue[queue] = ([queue_keys(queue).replaced], [])
            found[0].append(queue_keys(queue).latest(key))
            found[1].append(value)
        ttl_ms = max(int(ttl * 1000), 1)
        script = self._scripts.latest_put
        self._pipeline_raw(
            [self._call(script, keys, (ttl_ms, *values)) for keys, values in by_queue.values()],
            f"recording the latest calls of {len(latest)} debounce keys",
        )

    def get_latest(self, queue: str, keys: Sequence[str]) -> list[str | None]:
        """One ``MGET`` (the keys share the queue's hash tag: one slot of a cluster)."""
        if not keys:
            return []
        prefix = queue_keys(queue).latest_prefix
        [values] = self._pipeline_raw(
            [(("MGET", *[prefix + k for k in keys]), None)],
            f"reading the latest calls of {len(keys)} debounce keys",
        )
        return [None if v is None else bytes(v).decode() for v in values]

    def get_other_latest(
        self, queue: str, keys: Sequence[str], ids: Sequence[str]
    ) -> dict[int, str]:
        """One ``MGET``, whose replies are compared as bytes with what the calls' own records
        begin with (``debounce.own_prefixes``): a batch of its calls' own records, the usual
        one, decodes none of them."""
        if not keys:
            return {}
        prefix = queue_keys(queue).latest_prefix
        [values] = self._pipeline_raw(
            [(("MGET", *map(prefix.__add__, keys)), None)],
            f"reading the latest calls of {len(keys)} debounce keys",
        )
        prefixes = own_prefixes(ids).encode().split(b"\n")
        if len(prefixes) == len(values):
            try:
                if all(map(bytes.startswith, values, prefixes)):
                    return {}
            except TypeError:  # a key with no record: None
                pass
        return other_records([None if v is None else bytes(v).decode() for v in values], ids)

    def cancel(self, ids: Sequence[str], ttl: float) -> None:
        """Add the ids to ``hurtle:cancelled`` (dropping cancellations past their end), then
        raise the cancels flag of every known queue until this one ends: two round trips."""
        ttl = check_cancel_ttl(ttl)
        now = time.time()
        until = now + ttl
        mapping = {str(i): until for i in ids}
        if not mapping:
            return
        _, _, names = self._pipeline(
            [
                (("ZADD", CANCELLED, *[x for i in mapping for x in (until, i)]), None),
                (("ZREMRANGEBYSCORE", CANCELLED, "-inf", f"({now!r}"), None),
                (("SMEMBERS", QUEUES), None),
            ],
            f"cancelling {len(mapping)} messages",
        )
        until_ms = math.ceil(until * 1000)
        flags = [
            self._call(self._scripts.cancel_flag, (queue_keys(n.decode()).cancels,), (until_ms,))
            for n in names
        ]
        if flags:
            self._pipeline(flags, "raising the cancels flags of the queues")

    def cancelled(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        (scores,) = self._pipeline(
            [(("ZMSCORE", CANCELLED, *ids), None)], f"reading the cancellations of {len(ids)} ids"
        )
        now = time.time()
        return {
            i
            for i, score in zip(ids, scores, strict=True)
            if score is not None and float(score) > now
        }

    def cancellations_live(self) -> bool:
        (live,) = self._pipeline(
            [(("ZCOUNT", CANCELLED, f"({time.time()!r}", "+inf"), None)],
            "counting the live cancellations",
        )
        return bool(live)

    def uncancel(self, ids: Sequence[str]) -> None:
        if ids:
            self._pipeline([(("ZREM", CANCELLED, *ids), None)], "lifting cancellations")

    def pause(self, queue: str) -> None:
        check_queue_name(queue)
        self._pipeline(
            [(("SADD", QUEUES, queue), None), (("SET", queue_keys(queue).paused, "1"), None)],
            f"pausing queue {queue!r}",
        )

    def resume(self, queue: str) -> None:
        check_queue_name(queue)
        k = queue_keys(queue)
        # a token on the wake list wakes a consumer blocked on it; the fetch that takes the
        # last ready message clears stale tokens
        self._pipeline(
            [(("DEL", k.paused), None), (("RPUSH", k.wake, "1"), None)],
            f"resuming queue {queue!r}",
        )

    def paused(self) -> set[str]:
        names = self.queues()
        if not names:
            return set()
        flags = self._pipeline(
            [(("EXISTS", queue_keys(n).paused), None) for n in names], "reading paused queues"
        )
        return {n for n, flag in zip(names, flags, strict=True) if flag}

    def forget(self, queue: str) -> bool:
        """``SREM`` the name if the queue is empty, then look again: a message published in
        between (its ``SADD`` came first) puts the name back. ``hurtle:queues`` lives in
        another slot than the queue's keys, so this cannot be one script."""
        check_queue_name(queue)
        empty = QueueStats()
        if self.stats([queue])[queue] != empty:
            return False
        self._pipeline([(("SREM", QUEUES, queue), None)], f"forgetting queue {queue!r}")
        if self.stats([queue])[queue] == empty:
            return True
        self._pipeline([(("SADD", QUEUES, queue), None)], f"knowing queue {queue!r} again")
        return False
