"""``Reads``: the dashboard's broker reads, each bounded in time and shared while under way.

A broker that does not answer must not hang the pages that read it. A host cut off from Redis
sees no error at first: TCP retransmits in silence, and a read waits for the client's socket
timeout (30 s on Redis) before it fails. So every read the API makes goes through
``Reads.run``: a read not finished within ``within`` seconds fails its request with
``BrokerError`` (503: "the broker failed: no answer within 5s ...") while the read itself goes on
in its thread; requests for the same read meanwhile wait on that one instead of starting
another, so a dashboard polled during an outage holds one thread per kind of read, not one per
request. When the broker answers again, so do the pages.

Writes (pause, purge, retry of dead letters) are not bounded here: a write cut short would leave
its caller unsure whether it happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

import anyio.to_thread

from ..errors import BrokerError

#: Seconds a read may take before its request answers 503 (``create_app(read_timeout=...)``).
READ_TIMEOUT = 5.0


class Reads:
    """Runs blocking broker reads on threads, each request waiting at most ``within`` seconds."""

    def __init__(self, within: float = READ_TIMEOUT) -> None:
        self.within = within
        self._under_way: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a thread, or the same call already under way; ``BrokerError`` if it
        does not finish within ``within`` seconds."""
        # the arguments by identity: they stay alive while the read is under way, so no other
        # object has their ids meanwhile
        key = (fn, *map(id, args))
        read = self._under_way.get(key)
        if read is None:
            read = asyncio.ensure_future(anyio.to_thread.run_sync(fn, *args))
            self._under_way[key] = read
            read.add_done_callback(lambda done: self._done(key, done))
        try:
            return await asyncio.wait_for(asyncio.shield(read), self.within)
        except TimeoutError:
            raise BrokerError(
                f"no answer within {self.within:g}s (is it reachable from here?); the pages "
                "show its figures again as soon as it answers"
            ) from None

    def _done(self, key: Hashable, read: asyncio.Future[Any]) -> None:
        if self._under_way.get(key) is read:
            del self._under_way[key]
        if not read.cancelled():
            read.exception()  # retrieved: a read no request waited for any more fails quietly
