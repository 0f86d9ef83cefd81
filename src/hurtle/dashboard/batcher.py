"""Coalescing publisher: concurrent enqueue requests share one ``broker.publish``.

A request hands its messages to ``Batcher.publish`` and awaits. The first one waits ``window``
seconds for others to join, then the whole lot goes to the broker in one call (on a worker
thread: brokers are synchronous); requests arriving while that call runs make up the next batch.

A request is checked and encoded on its own (``check_messages``, ``encode_many``) before it
joins, so one whose fields are invalid or whose arguments cannot be encoded fails alone, with
its own ``EncodeError``, and the others go on. What fails the shared call is then the broker's
doing (``BrokerError``): every request of the batch gets it, and none of their messages is
acknowledged as enqueued. Should the shared call refuse the content of some request all the
same (another ``HurtleError``), each request of the batch is published again on its own, so
that only the one at fault gets the error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import anyio.to_thread

from ..brokers import Broker
from ..errors import BrokerError, HurtleError
from ..message import Message, check_messages, encode_many

_Pending = tuple[Sequence[Message], "asyncio.Future[None]"]


class Batcher:
    def __init__(self, broker: Broker, window: float = 0.002, max_batch: int = 5000) -> None:
        self.broker = broker
        self.window = window
        self.max_batch = max_batch
        self._pending: deque[_Pending] = deque()
        self._draining = False
        self._task: asyncio.Task[None] | None = None
        #: Broker calls made and messages published through them (for tests and benchmarks).
        self.calls = 0
        self.published = 0

    async def publish(self, messages: Sequence[Message]) -> None:
        """Publish one request's messages with those of concurrent requests; raises this
        request's own ``EncodeError``, or the ``BrokerError`` of the shared call."""
        check_messages(messages)
        encode_many(list(messages), self.broker.max_message_size)
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
                batch: list[_Pending] = []
                size = 0
                while self._pending and (not batch or size < self.max_batch):
                    item = self._pending.popleft()
                    batch.append(item)
                    size += len(item[0])
                await self._publish(batch)
        finally:
            self._draining = False

    async def _publish(self, batch: list[_Pending]) -> None:
        messages = [m for ms, _ in batch for m in ms]
        try:
            await anyio.to_thread.run_sync(self.broker.publish, messages)
        except HurtleError as err:
            if isinstance(err, BrokerError) or len(batch) == 1:
                _settle(batch, err)
            else:  # the content of one request: find it by publishing each alone
                for item in batch:
                    await self._publish([item])
        except Exception as err:
            _settle(batch, err)
        else:
            self.calls += 1
            self.published += len(messages)
            _settle(batch, None)


def _settle(batch: list[_Pending], err: BaseException | None) -> None:
    for _, done in batch:
        if not done.done():
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(err)
