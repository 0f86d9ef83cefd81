"""The Redis broker against the raw Redis loops that DESIGN.md budgets it by.

Starts a private ``redis-server`` on a free port, then measures, on the same N encoded messages:

* raw publish: pipelined ``LPUSH``, 1,000 commands per round trip;
* hurtle publish: ``RedisBroker.publish`` in batches of 1,000 ``Message``s (encoding included);
* raw consume: ``LPOP key 1000`` until the list is empty (and again decoding every message, the
  raw loop DESIGN.md's table measures);
* hurtle consume: ``fetch(1000)`` + ``ack`` of the batch until the queue is empty (and again
  decoding every message).

Each scenario runs ROUNDS times on a shared machine and keeps its best; one line per scenario,
then the ratios (budget: hurtle >= 0.5x raw).

    python benchmarks/redis_broker_vs_raw.py [N]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import redis
from hurtle.bench.harness.servers import RedisServer
from hurtle.brokers.redis import RedisBroker
from hurtle.ids import new_id
from hurtle.message import Message

BATCH = 1000
ROUNDS = 3


def raw_publish(client: redis.Redis, bodies: list[bytes]) -> float:
    start = time.perf_counter()
    for i in range(0, len(bodies), BATCH):
        pipe = client.pipeline(transaction=False)
        for body in bodies[i : i + BATCH]:
            pipe.lpush("raw", body)
        pipe.execute()
    return time.perf_counter() - start


def raw_consume(client: redis.Redis, n: int, decode: bool) -> float:
    start = time.perf_counter()
    got = 0
    while True:
        items: Any = client.lpop("raw", BATCH)
        if not items:
            break
        if decode:
            for raw in items:
                Message.decode(raw)
        got += len(items)
    elapsed = time.perf_counter() - start
    assert got == n, got
    return elapsed


def hurtle_publish(broker: RedisBroker, messages: list[Message]) -> float:
    start = time.perf_counter()
    for i in range(0, len(messages), BATCH):
        broker.publish(messages[i : i + BATCH])
    return time.perf_counter() - start


def hurtle_consume(broker: RedisBroker, n: int, decode: bool) -> float:
    consumer = broker.consumer(["bench"])
    start = time.perf_counter()
    got = 0
    while True:
        batch = consumer.fetch(BATCH, 0)
        if not batch:
            break
        if decode:
            for delivery in batch:
                Message.decode(delivery.raw)
        consumer.ack(batch)
        got += len(batch)
    elapsed = time.perf_counter() - start
    consumer.close()
    assert got == n, got
    return elapsed


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    server = RedisServer()
    url = server.url
    try:
        messages = [Message(id=new_id(), task="add", queue="bench", args=(5, 6)) for _ in range(n)]
        bodies = [m.encode() for m in messages]
        client = redis.Redis.from_url(url)
        broker = RedisBroker(url)
        rates: dict[str, float] = {}
        best: dict[str, float] = {}
        for _ in range(ROUNDS):
            # Each publish fills the list that the next consume empties; refills are not timed.
            scenarios: list[tuple[str | None, Callable[[], float]]] = [
                ("raw pipelined LPUSH x1000", lambda: raw_publish(client, bodies)),
                ("raw LPOP key 1000", lambda: raw_consume(client, n, False)),
                ("hurtle publish() x1000", lambda: hurtle_publish(broker, messages)),
                ("hurtle fetch(1000) + ack", lambda: hurtle_consume(broker, n, False)),
                (None, lambda: raw_publish(client, bodies)),
                ("raw LPOP 1000 + decode", lambda: raw_consume(client, n, True)),
                (None, lambda: hurtle_publish(broker, messages)),
                ("hurtle fetch + decode + ack", lambda: hurtle_consume(broker, n, True)),
            ]
            for name, run in scenarios:
                elapsed = run()
                if name is not None:
                    best[name] = min(best.get(name, elapsed), elapsed)
        for name, elapsed in best.items():
            rates[name] = n / elapsed
            print(f"{name:28} {rates[name]:>10,.0f} tasks/s")
        ratios = [
            ("publish ratio", "hurtle publish() x1000", "raw pipelined LPUSH x1000"),
            ("consume ratio", "hurtle fetch(1000) + ack", "raw LPOP key 1000"),
            ("consume+decode ratio", "hurtle fetch + decode + ack", "raw LPOP 1000 + decode"),
        ]
        for label, ours, theirs in ratios:
            print(f"{label:28} {rates[ours] / rates[theirs]:>10.2f}x  (budget >= 0.5x)")
        broker.close()
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
