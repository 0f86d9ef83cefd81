"""The raw nats-py loop hurtle on NATS is measured against: one JetStream work-queue stream, one
durable pull consumer, ``fetch`` of 1,000 and an acknowledgement per message.

Messages are the raw loops' msgpack maps (``raw_loop``) on the subject ``benchraw``, published
1,000 at a time with their publish acknowledgements awaited together. The consumer decodes each
message, calls the function it names and acknowledges it (``msg.ack()``: one message to the
server, no reply awaited), as a nats-py user writing a worker by hand would.

    python -m hurtle.bench.harness.publish hurtle.bench.peers.raw_nats:publish COUNT
    python -m hurtle.bench.peers.raw_nats consume COUNT
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from .raw_loop import BATCH, FUNCTIONS, consumer_main, message

STREAM = "BENCHRAW"
SUBJECT = "benchraw"


def _url() -> str:
    return os.environ["HURTLE_BROKER_URL"]


async def _connect() -> tuple[Any, Any]:
    import nats
    from nats.js import api

    nc = await nats.connect(_url())
    js = nc.jetstream()
    config = api.StreamConfig(
        name=STREAM, subjects=[SUBJECT], retention=api.RetentionPolicy.WORK_QUEUE
    )
    with contextlib.suppress(Exception):  # made by the other side already
        await js.add_stream(config)
    return nc, js


def publish(count: int, progress: Callable[[int], None]) -> int:
    async def main() -> int:
        nc, js = await _connect()
        sent = 0
        while sent < count:
            n = min(BATCH, count - sent)
            payloads = [message() for _ in range(n)]
            await asyncio.gather(*(js.publish(SUBJECT, p) for p in payloads))
            sent += n
            progress(sent)
        await nc.close()
        return sent

    return asyncio.run(main())


def consume(count: int) -> int:
    async def main() -> int:
        import nats.errors

        nc, js = await _connect()
        sub = await js.pull_subscribe(SUBJECT, durable="raw", stream=STREAM)
        decode = msgspec.msgpack.decode
        functions = FUNCTIONS
        done = 0
        while done < count:
            try:
                msgs = await sub.fetch(BATCH, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                task = decode(msg.data)
                functions[task["task"]](*task["args"])
                await msg.ack()
            done += len(msgs)
        await nc.flush()
        return done

    return asyncio.run(main())


def leftover(url: str) -> int | None:
    """Messages still in the stream (a work-queue stream drops what was acknowledged)."""

    async def main() -> int:
        import nats

        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info(STREAM)
            return int(info.state.messages)
        finally:
            await nc.close()

    return asyncio.run(main())


if __name__ == "__main__":
    consumer_main(sys.argv[1:], consume)
