"""Pull requests on the queues' durable consumers, through one inbox subscription per client.

A pull asks for at most ``n`` messages without waiting (``no_wait``, with a short ``expires``
for a consumer that may have reached its ``MaxAckPending``) and ends when ``n`` came or the
server sent its status (404: none, 408: fewer than asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

from . import names

#: How long a pull waits at most for a consumer that holds back (quarantine: one at a time).
EXPIRES_NS = 20_000_000


class _Pull:
    __slots__ = ("done", "got", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.got: list[Any] = []
        self.done = asyncio.get_running_loop().create_future()


class Puller:
    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox()
        self._pulls: dict[str, _Pull] = {}
        self._seq = itertools.count()
        self._sub: Any = None
        # messages arrive under their own subjects, statuses under the pull's reply subject:
        # one pull at a time, so that every message belongs to the current one
        self._lock = asyncio.Lock()
        self._current: _Pull | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.inbox + ".*", cb=self._on_msg)

    async def _on_msg(self, msg: Any) -> None:
        if not msg.reply:  # a status: its pull is over
            pull = self._pulls.get(msg.subject)
            if pull is not None and not pull.done.done():
                pull.done.set_result(None)
            return
        pull = self._current
        if pull is None:  # came after its pull gave up: let another worker have it now
            await self.nc.publish(msg.reply, b"-NAK")
            return
        pull.got.append(msg)
        if len(pull.got) >= pull.n and not pull.done.done():
            pull.done.set_result(None)

    async def pull(self, queue: str, level: str, n: int) -> list[Any]:
        async with self._lock:
            return await self._pull(queue, level, n)

    async def _pull(self, queue: str, level: str, n: int) -> list[Any]:
        reply = f"{self.inbox}.{next(self._seq)}"
        pull = self._current = self._pulls[reply] = _Pull(n)
        try:
            request = json.dumps({"batch": n, "no_wait": True, "expires": EXPIRES_NS}).encode()
            await self.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{names.stream(queue)}.{names.durable(level)}",
                request,
                reply=reply,
            )
            with contextlib.suppress(TimeoutError):  # no status came: keep what did
                await asyncio.wait_for(asyncio.shield(pull.done), 5.0)
            return pull.got
        finally:
            del self._pulls[reply]
            self._current = None

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
