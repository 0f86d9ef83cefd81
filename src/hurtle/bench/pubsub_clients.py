"""The publisher and subscriber loops of ``hurtle bench pubsub``, one per system, each run in its
own process. A publisher sends 20-byte payloads to channels picked at random until the clock
says stop; a subscriber listens to every channel and counts what arrives, per second of the
measured window and in total. Both report a ``dict`` on the result queue.

Systems: ``hurtle`` (channels on Redis, buffered or ``buffer=0``), ``redis-publish`` (redis-py,
one ``PUBLISH`` per message), ``redis-pipelined`` (redis-py pipeline flushed at 1,000 commands or
every 200 ms, seed 003's ``BufferedRedis``), ``zmq`` (PUSH to a ``zmq.proxy`` PULL→PUB process,
SUB from it) and ``nats`` (core NATS through nats-py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
from collections.abc import Callable
from typing import Any

#: Messages sent between two looks at the clock.
_CHECK_EVERY = 512
#: A subscriber stops once nothing arrived for this long after the publishers stopped (hurtle's
#: tail frames come 1 s after the last frame)...
_IDLE_AFTER_STOP = 1.5
#: ...or this long after they stopped, whichever comes first: what is still queued for it by
#: then counts as not delivered.
_DRAIN_MAX = 60.0


@dataclasses.dataclass(frozen=True)
class Setup:
    system: str
    redis_url: str
    channels: tuple[str, ...]
    payload_size: int
    duration: float
    zmq_in: str = ""
    zmq_out: str = ""
    nats_url: str = ""


class Counter:
    """Counts messages into one-second buckets of the measured window."""

    def __init__(self, start: float, duration: float) -> None:
        self.start = start
        self.stop = start + duration
        self.buckets = [0] * max(int(duration), 1)
        self.total = 0
        self.last_seen = time.time()

    def add(self, n: int) -> None:
        now = time.time()
        self.total += n
        self.last_seen = now
        i = int(now - self.start)
        if 0 <= i < len(self.buckets):
            self.buckets[i] += n

    def done(self) -> bool:
        now = time.time()
        return now > self.stop and (
            now - self.last_seen > _IDLE_AFTER_STOP or now > self.stop + _DRAIN_MAX
        )


def _ready_and_wait(ready: Any, go: Any, start: Any) -> float:
    ready.put("ready")
    go.wait()
    return float(start.value)


def _choices(n_channels: int) -> list[int]:
    rng = random.Random()
    return [rng.randrange(n_channels) for _ in range(8191)]


# -- publishers ---------------------------------------------------------------------------------


def publisher(setup: Setup, ready: Any, go: Any, start: Any, results: Any) -> None:
    publish, finish = _PUBLISHERS[setup.system.split("-")[0]](setup)
    picks = _choices(len(setup.channels))
    at = _ready_and_wait(ready, go, start)
    while time.time() < at:
        time.sleep(0.001)
    stop = at + setup.duration
    sent = 0
    n_picks = len(picks)
    while True:
        for _ in range(_CHECK_EVERY):
            publish(picks[sent % n_picks])
            sent += 1
        if time.time() >= stop:
            break
    error = ""
    try:
        finish()
    except Exception as err:  # reported in the row's notes; what was sent still counts
        error = f"{type(err).__name__}: {err}"
    results.put({"role": "publisher", "sent": sent, "error": error})


def _hurtle_publisher(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    from ..app import Hurtle

    app = Hurtle(setup.redis_url)
    buffer = 0 if setup.system.endswith("buffer0") else None
    channels = [app.channel(c, buffer=buffer) for c in setup.channels]
    payload = "x" * setup.payload_size
    publishes = [ch.publish for ch in channels]

    def publish(i: int) -> None:
        publishes[i](payload)

    return publish, app.close


def _redis_publisher(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    import redis

    client = redis.Redis.from_url(setup.redis_url)
    client.ping()
    names = [c.encode() for c in setup.channels]
    payload = b"x" * setup.payload_size
    if setup.system == "redis-publish":

        def publish(i: int) -> None:
            client.publish(names[i], payload)

        return publish, client.close

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


def _zmq_publisher(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    import zmq

    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(setup.zmq_in)
    names = [c.encode() for c in setup.channels]
    payload = b"x" * setup.payload_size

    def publish(i: int) -> None:
        push.send_multipart((names[i], payload))

    def finish() -> None:
        push.close(linger=5000)
        context.term()

    return publish, finish


def _nats_publisher(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
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
        if len(pending) >= _CHECK_EVERY:
            loop.run_until_complete(send(pending))
            pending.clear()

    def finish() -> None:
        loop.run_until_complete(send(pending))
        loop.run_until_complete(nc.flush(timeout=120))
        loop.run_until_complete(nc.close())
        loop.close()

    return publish, finish


_PUBLISHERS: dict[str, Callable[[Setup], tuple[Callable[[int], None], Callable[[], None]]]] = {
    "hurtle": _hurtle_publisher,
    "redis": _redis_publisher,
    "zmq": _zmq_publisher,
    "nats": _nats_publisher,
}


# -- subscribers --------------------------------------------------------------------------------


def subscriber(setup: Setup, ready: Any, go: Any, start: Any, results: Any) -> None:
    kind = setup.system.split("-")[0]
    report = _SUBSCRIBERS[kind](setup, ready, go, start)
    results.put({"role": "subscriber"} | report)


def _hurtle_subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    from ..app import Hurtle

    app = Hurtle(setup.redis_url)
    sub = app.subscribe(*setup.channels)
    count = Counter(_ready_and_wait(ready, go, start), setup.duration)
    n = 0
    get = sub.get
    while not count.done():
        msg = get(0.2)
        if msg is None:
            continue
        n += 1
        if n == 64:
            count.add(64)
            n = 0
    count.add(n)
    sub.close()
    app.close()
    return {
        "received": count.total,
        "per_second": count.buckets,
        "lost": sub.lost,
        "reconnects": sub.reconnects,
    }


def _redis_subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(setup.redis_url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(*setup.channels)
    for _ in setup.channels:  # the confirmations: what is published from now on arrives
        pubsub.parse_response(block=False, timeout=10)
    count = Counter(_ready_and_wait(ready, go, start), setup.duration)
    n = 0
    errors = 0
    while not count.done():
        try:
            msg = pubsub.get_message(timeout=0.2)
        except redis.ConnectionError:
            errors += 1  # redis-py subscribes again on its own; what was missed is not known
            continue
        if msg is None:
            continue
        n += 1
        if n == 64:
            count.add(64)
            n = 0
    count.add(n)
    pubsub.close()
    client.close()
    return {
        "received": count.total,
        "per_second": count.buckets,
        "lost": None,
        "reconnects": errors,
    }


def _zmq_subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.connect(setup.zmq_out)
    for name in setup.channels:
        sub.setsockopt(zmq.SUBSCRIBE, name.encode())
    time.sleep(0.5)  # a SUB socket has no subscription confirmation to wait for
    count = Counter(_ready_and_wait(ready, go, start), setup.duration)
    n = 0
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    recv = sub.recv_multipart
    while not count.done():
        if not poller.poll(200):
            continue
        while True:
            try:
                recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            if n == 64:
                count.add(64)
                n = 0
    count.add(n)
    sub.close(linger=0)
    context.term()
    return {"received": count.total, "per_second": count.buckets, "lost": None, "reconnects": 0}


def _nats_subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
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
        at = await asyncio.to_thread(_ready_and_wait, ready, go, start)
        count = Counter(at, setup.duration)
        while not count.done():
            await asyncio.sleep(0.05)
            if seen[0]:
                count.add(seen[0])
                seen[0] = 0
        await nc.close()
        return {
            "received": count.total,
            "per_second": count.buckets,
            "lost": None,
            "reconnects": 0,
            "slow_consumer_errors": slow,
        }

    return asyncio.run(main())


_SUBSCRIBERS: dict[str, Callable[[Setup, Any, Any, Any], dict[str, Any]]] = {
    "hurtle": _hurtle_subscriber,
    "redis": _redis_subscriber,
    "zmq": _zmq_subscriber,
    "nats": _nats_subscriber,
}


def zmq_proxy(pull_address: str, pub_address: str) -> None:
    """The broker of the zmq row: PULL from publishers, PUB to subscribers, until killed."""
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(pull_address)
    pub = context.socket(zmq.PUB)
    pub.bind(pub_address)
    zmq.proxy(pull, pub)
