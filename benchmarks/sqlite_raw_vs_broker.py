"""The SQLite broker against a plain sqlite3 loop doing the same storage work.

Both store N messages in batches of 1,000 and take them out again in batches of 1,000, on a WAL
file with ``synchronous=NORMAL`` (the broker and the demo through ``?synchronous=normal``; what
the broker's default, ``full``, costs is measured by ``sqlite_synchronous.py``). The raw loop
inserts and then deletes rows with ``RETURNING``; the broker line publishes ``Message``s, fetches
them (claiming), and acknowledges them; the demo line is the whole of ``hurtle demo``:
``send_many`` from a task, then a solo worker (fetch loop, processor, batched acker, heartbeat)
running ``add(5, 6)`` until the queue is drained. One line per scenario; the budget (issue
"hurtle core") is the demo >= 1/3 of raw.

    python benchmarks/sqlite_raw_vs_broker.py [N] [ROUNDS]
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hurtle.brokers.sqlite import SQLiteBroker
from hurtle.cli.demo import demo
from hurtle.ids import new_id
from hurtle.message import Message

BATCH = 1000


def raw_loop(path: Path, n: int, bodies: list[bytes]) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO t (body) VALUES (?)", [(b,) for b in bodies[i : i + BATCH]])
        conn.execute("COMMIT")
    got = 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY id LIMIT ?) RETURNING body",
            (BATCH,),
        ).fetchall()
        conn.execute("COMMIT")
        if not rows:
            break
        got += len(rows)
    elapsed = time.perf_counter() - start
    assert got == n, got
    conn.close()
    return elapsed


def hurtle_loop(path: Path, n: int, messages: list[Message]) -> float:
    broker = SQLiteBroker(f"sqlite:///{path}?synchronous=normal")
    consumer = broker.consumer(["bench"])
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        broker.publish(messages[i : i + BATCH])
    got = 0
    while True:
        deliveries = consumer.fetch(BATCH, 0)
        if not deliveries:
            break
        consumer.ack(deliveries)
        got += len(deliveries)
    elapsed = time.perf_counter() - start
    assert got == n, got
    consumer.close()
    broker.close()
    return elapsed


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    messages = [Message(id=new_id(), task="add", queue="bench", args=(5, 6)) for _ in range(n)]
    bodies = [m.encode() for m in messages]
    raw_rates, broker_rates, demo_rates, demo_ratios, broker_ratios = [], [], [], [], []
    last: dict[str, float] = {}
    # rounds alternate the three so that a noisy moment on a shared machine hits them alike
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            raw = raw_loop(Path(tmp) / "raw.db", n, bodies)
            mine = hurtle_loop(Path(tmp) / "hurtle.db", n, messages)
            result = demo(f"sqlite:///{Path(tmp) / 'demo.db'}?synchronous=normal", n, quiet=True)
        assert result["ok"] == n, result
        full = result["publish_s"] + result["consume_s"]
        raw_rates.append(n / raw)
        broker_rates.append(n / mine)
        demo_rates.append(n / full)
        broker_ratios.append(raw / mine)
        demo_ratios.append(raw / full)
        last = result
    med = statistics.median
    print(f"{n:,} messages, {rounds} rounds, medians (min-max of the per-round ratio)")
    print(f"raw sqlite3 insert+delete        {med(raw_rates):>10,.0f} msg/s")
    print(
        f"hurtle broker publish+fetch+ack  {med(broker_rates):>10,.0f} msg/s  "
        f"{med(broker_ratios):.2f}x of raw ({min(broker_ratios):.2f}-{max(broker_ratios):.2f})"
    )
    print(
        f"hurtle demo send_many+worker     {med(demo_rates):>10,.0f} msg/s  "
        f"{med(demo_ratios):.2f}x of raw ({min(demo_ratios):.2f}-{max(demo_ratios):.2f}); "
        f"last round: publish {last['publish_rate']:,.0f}/s, "
        f"consume {last['consume_rate']:,.0f}/s"
    )


if __name__ == "__main__":
    main()
