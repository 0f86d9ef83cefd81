"""Row ``nats``: core NATS through nats-py, on a ``nats-server`` of its own; skipped without
nats-py or a ``nats-server`` on PATH. NATS counts slow-consumer errors, not losses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ...harness.servers import NatsServer
from ..loop import CHECK_EVERY, Client, Counter, Setup, ready_and_wait


@contextlib.contextmanager
def _broker() -> Iterator[dict[str, Any]]:
    server = NatsServer()
    try:
        yield {"nats_url": server.url}
    finally:
        server.stop()


def _publisher(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    import nats

    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(setup.nats_url))
    names = list(setup.channels)
    payload = b"x" * setup.payload_size
    pending: list[int] = []

    async def send(batch: list[int]) -> None:
        for i in batch:
            await nc.publish(names[i], payload)

    def publish(i: int) -> None:
        pending.append(i)
        if len(pending) >= CHECK_EVERY:
            loop.run_until_complete(send(pending))
            pending.clear()

    def finish() -> None:
        loop.run_until_complete(send(pending))
        loop.run_until_complete(nc.flush(timeout=120))
        loop.run_until_complete(nc.close())
        loop.close()

    return publish, finish


def _subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    import nats

    async def main() -> dict[str, Any]:
        slow = 0

        async def on_error(err: Exception) -> None:
            nonlocal slow
            slow += 1

        nc = await nats.connect(setup.nats_url, error_cb=on_error)
        seen = [0]

        async def on_message(_: Any) -> None:
            seen[0] += 1

        for name in setup.channels:
            await nc.subscribe(name, cb=on_message)
        await nc.flush()
        at = await asyncio.to_thread(ready_and_wait, ready, go, start)
        count = Counter(at, setup.duration)
        while not count.done():
            await asyncio.sleep(0.05)
            if seen[0]:
                count.add(seen[0])
                seen[0] = 0
        await nc.close()
        return count.report(slow_consumer_errors=slow)

    return asyncio.run(main())


ROWS = [
    Client(
        "nats",
        _publisher,
        _subscriber,
        modules={"nats": "nats-py"},
        programs=("nats-server",),
        broker=_broker,
    ),
]
