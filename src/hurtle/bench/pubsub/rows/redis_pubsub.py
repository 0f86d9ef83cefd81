"""Rows ``redis-publish`` (redis-py, one ``PUBLISH`` per message) and ``redis-pipelined`` (a
pipeline sent at 1,000 commands or every 200 ms, seed 003's ``BufferedRedis``); subscribers
are redis-py ``pubsub()`` objects. Redis counts no loss."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..loop import Client, Counter, Setup, ready_and_wait


def _client(setup: Setup) -> tuple[Any, list[bytes], bytes]:
    import redis

    client = redis.Redis.from_url(setup.redis_url)
    client.ping()
    return client, [c.encode() for c in setup.channels], b"x" * setup.payload_size


def _publish_each(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    client, names, payload = _client(setup)

    def publish(i: int) -> None:
        client.publish(names[i], payload)

    return publish, client.close


def _publish_pipelined(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    client, names, payload = _client(setup)
    # seed 003's BufferedRedis: a pipeline under a lock, sent at 1,000 commands or every 200 ms
    pipe = client.pipeline(transaction=False)
    lock = threading.Lock()
    stopping = threading.Event()

    def flusher() -> None:
        while not stopping.wait(0.2):
            with lock:
                pipe.execute()

    thread = threading.Thread(target=flusher, daemon=True)
    thread.start()

    def publish_buffered(i: int) -> None:
        with lock:
            pipe.publish(names[i], payload)
            if len(pipe.command_stack) >= 1000:
                pipe.execute()

    def finish() -> None:
        stopping.set()
        thread.join()
        with lock:
            pipe.execute()
        client.close()

    return publish_buffered, finish


def _subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(setup.redis_url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(*setup.channels)
    for _ in setup.channels:  # the confirmations: what is published from now on arrives
        pubsub.parse_response(block=False, timeout=10)
    errors = 0

    def get(timeout: float) -> object | None:
        nonlocal errors
        try:
            msg: object = pubsub.get_message(timeout=timeout)
        except redis.ConnectionError:
            errors += 1  # redis-py subscribes again on its own; what was missed is not known
            return None
        return msg

    count = Counter(ready_and_wait(ready, go, start), setup.duration)
    count.receive(get, 0.2)
    pubsub.close()
    client.close()
    return count.report(reconnects=errors)


ROWS = [
    Client("redis-publish", _publish_each, _subscriber),
    Client("redis-pipelined", _publish_pipelined, _subscriber),
]
