"""What ``?synchronous=full`` costs the SQLite broker against ``?synchronous=normal``.

For each level, on a fresh WAL file: publish N messages in batches of 1,000 and consume them with
fetch + ack in batches of 1,000 (one commit per batch, as a worker does), then publish and consume
M messages one at a time (one ``send`` and one commit per message: the worst case). One line per
scenario and level; the median of ROUNDS runs.

    python benchmarks/sqlite_synchronous.py [N] [M] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hurtle.brokers.sqlite import SYNCHRONOUS_LEVELS, SQLiteBroker
from hurtle.ids import new_id
from hurtle.message import Message

BATCH = 1000


def batched(url: str, messages: list[Message]) -> tuple[float, float]:
    broker = SQLiteBroker(url)
    consumer = broker.consumer(["bench"])
    start = time.perf_counter()
    for i in range(0, len(messages), BATCH):
        broker.publish(messages[i : i + BATCH])
    published = time.perf_counter()
    got = 0
    while deliveries := consumer.fetch(BATCH, 0):
        consumer.ack(deliveries)
        got += len(deliveries)
    consumed = time.perf_counter()
    assert got == len(messages), got
    consumer.close()
    broker.close()
    return published - start, consumed - published


def one_by_one(url: str, messages: list[Message]) -> tuple[float, float]:
    broker = SQLiteBroker(url)
    consumer = broker.consumer(["bench"])
    start = time.perf_counter()
    for m in messages:
        broker.publish([m])
    published = time.perf_counter()
    got = 0
    while deliveries := consumer.fetch(1, 0):
        consumer.ack(deliveries)
        got += 1
    consumed = time.perf_counter()
    assert got == len(messages), got
    consumer.close()
    broker.close()
    return published - start, consumed - published


def measure(
    run: Callable[[str, list[Message]], tuple[float, float]], level: str, n: int, rounds: int
) -> tuple[float, float]:
    publish: list[float] = []
    consume: list[float] = []
    for _ in range(rounds):
        messages = [Message(id=new_id(), task="add", queue="bench", args=(5, 6)) for _ in range(n)]
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}?synchronous={level}"
            p, c = run(url, messages)
        publish.append(n / p)
        consume.append(n / c)
    return statistics.median(publish), statistics.median(consume)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 2_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    for name, run, count in (("batches of 1,000", batched, n), ("one by one", one_by_one, m)):
        for level in SYNCHRONOUS_LEVELS:
            p, c = measure(run, level, count, rounds)
            print(
                f"{name:>16}  synchronous={level:<6}  publish {p:>10,.0f}/s  "
                f"fetch+ack {c:>10,.0f}/s  ({count:,} messages, median of {rounds})"
            )


if __name__ == "__main__":
    main()
