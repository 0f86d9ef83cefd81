"""Delayed messages: stored on the queue's ``d`` subject with their eta and priority in headers,
and handed to their level when due by a promoter.

Each broker with a consumer of a queue runs a promoter for it on the loop: it pulls the ``d``
consumer, and for each message either publishes it to its level (under a ``Nats-Msg-Id`` made
of its sequence, so that two promoters racing publish it once) and then acknowledges it, or
gives it back with a negative acknowledgement delayed until its eta: the server keeps the time
and delivers it again then. Delayed messages wait while no consumer of their queue runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from . import names
from .store import Store

#: Longest a promoter's pull waits on the server before it asks again (seconds).
PULL_SECONDS = 5.0


class Promoters:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, queue: str) -> None:
        """Promote ``queue``'s delayed messages from now on (called on the loop)."""
        if queue not in self._tasks:
            self._tasks[queue] = asyncio.ensure_future(self._run(queue))

    async def _run(self, queue: str) -> None:
        nc = self.store.nc
        inbox = nc.new_inbox()
        stream = names.stream(queue)

        async def on_msg(msg: Any) -> None:
            if msg.reply:
                await self._one(queue, stream, msg)

        sub = await nc.subscribe(inbox, cb=on_msg)
        request = json.dumps({"batch": 1000, "expires": int(PULL_SECONDS * 1e9)}).encode()
        try:
            while True:
                await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.d", request, reply=inbox)
                await asyncio.sleep(PULL_SECONDS)
        finally:
            if not nc.is_closed:
                await sub.unsubscribe()

    async def _one(self, queue: str, stream: str, msg: Any) -> None:
        headers = msg.headers or {}
        eta = float(headers.get(names.ETA, "0"))
        wait = eta - time.time()
        if wait > 0.001:
            delay = json.dumps({"delay": int(wait * 1e9)})
            await self.store.nc.publish(msg.reply, b"-NAK " + delay.encode())
            return
        level = headers.get(names.PRIORITY, "0")
        _, _, _, seq = names.parse_reply(msg.reply)
        out = {names.MSG_ID: f"p.{stream}.{seq}"}
        if names.DEATHS in headers:
            out[names.DEATHS] = headers[names.DEATHS]
        await self.store.js.publish(names.subject(queue, level), msg.data, headers=out)
        self.store.note(queue, level)
        await self.store.nc.request(msg.reply, b"+ACK", timeout=10.0)
        await self.store.wake([queue])

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
