"""Coalescing publisher: concurrent enqueue requests share one ``broker.publish``.

A request hands its checked messages to ``Batcher.publish`` and awaits. The first one waits
``window`` seconds for others to join, then the whole lot goes to the broker in one call (on a
worker thread: brokers are synchronous); requests arriving while that call runs make up the
next batch. Each request's messages are checked (``check_messages``) before they join, so a bad
one fails alone; a broker failure fails every request of its batch, and none of their messages
is acknowledged as enqueued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import anyio.to_thread

from ..brokers import Broker
from ..message import Message, check_messages


class Batcher:
    def __init__(self, broker: Broker, window: float = 0.002, max_batch: int = 5000) -> None:
        self.broker = broker
        self.window = window
        self.max_batch = max_batch
        self._pending: deque[tuple[Sequence[Message], asyncio.Future[None]]] = deque()
        self._draining = False
        self._task: asyncio.Task[None] | None = None
        #: Broker calls made and messages published through them (for tests and benchmarks).
        self.calls = 0
        self.published = 0

    async def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((messages, done))
        if not self._draining:
            self._draining = True
            self._task = loop.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(self.window)
                batch: list[tuple[Sequence[Message], asyncio.Future[None]]] = []
                size = 0
                while self._pending and (not batch or size < self.max_batch):
                    item = self._pending.popleft()
                    batch.append(item)
                    size += len(item[0])
                messages = [m for ms, _ in batch for m in ms]
                try:
                    await anyio.to_thread.run_sync(self.broker.publish, messages)
                except Exception as err:
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(err)
                else:
                    self.calls += 1
                    self.published += len(messages)
                    for _, done in batch:
                        if not done.done():
                            done.set_result(None)
        finally:
            self._draining = False
