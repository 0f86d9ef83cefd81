"""The ``outbox`` row of ``hurtle bench features``: ``bench.add`` sent through the outbox
(``outbox=``, the PostgreSQL database of ``$HURTLE_BENCH_OUTBOX_URL``) in transactions of
``BATCH`` sends, relayed to the row's Redis by a ``hurtle outbox relay`` process of its own.

The time is from the first send until the relay has published the last (the outbox is empty
again), so the row's publish rate is what reaches the broker, commit and relay included; the
suite compares it with the ``bare`` row's (``send_many`` straight to Redis) beside it. Then the
relay's lag, commit to published: ``LAG_SAMPLES`` sends of one call, each in a transaction of
its own, to a queue of their own (purged after: the worker consumes only the row's calls), each
timed from its commit until the relay's publish wakes the queue (a ``BLPOP`` on its wake list).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ...app import Hurtle
from ...brokers.keys import queue_keys

BATCH = 1000
LAG_SAMPLES = 300
LAG_QUEUE = "bench-lag"

app = Hurtle(heartbeat_timeout=10, outbox=os.environ.get("HURTLE_BENCH_OUTBOX_URL") or None)


@app.task(name="bench.add")
def add(x: int, y: int) -> int:
    return x + y


def _waiting(conn: Any) -> int:
    table = app.outbox
    assert table is not None
    row = conn.execute(table.COUNT).fetchone()
    return int(row[0]) if row else 0


def publish(count: int, progress: Callable[[int], None]) -> dict[str, Any]:
    import psycopg

    import redis

    table = app.outbox
    assert table is not None, "HURTLE_BENCH_OUTBOX_URL is not set"
    with psycopg.connect(os.environ["HURTLE_BENCH_OUTBOX_URL"].partition("?")[0]) as fresh:
        fresh.execute(f'DROP TABLE IF EXISTS "{table.schema}".outbox')  # made anew just below
    own = table.connect()
    relay = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hurtle",
            "--log-level",
            "WARNING",
            "outbox",
            "relay",
            f"{__name__}:app",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert relay.stdout is not None
    relay.stdout.readline()  # it is connected
    database = os.environ["HURTLE_BENCH_OUTBOX_URL"].partition("?")[0]
    client = redis.Redis.from_url(os.environ["HURTLE_BROKER_URL"])
    try:
        with psycopg.connect(database) as conn:
            started = time.perf_counter()
            sent = 0
            while sent < count:
                n = min(BATCH, count - sent)
                add.options(connection=conn).send_many([(i, 6) for i in range(sent, sent + n)])
                conn.commit()
                sent += n
                progress(sent)
            while _waiting(own):
                time.sleep(0.001)
            seconds = time.perf_counter() - started
            lags = _lags(conn, client)
    finally:
        relay.terminate()
        relay.wait(30)
        own.close()
        client.close()
    app.broker.purge(LAG_QUEUE)
    app.close()
    cuts = statistics.quantiles(lags, n=100)
    return {
        "count": sent,
        "seconds": seconds,
        "notes": [f"relay lag p50 {cuts[49] * 1000:.1f} ms, p99 {cuts[98] * 1000:.1f} ms"],
    }


def _lags(conn: Any, client: Any) -> list[float]:
    """Seconds from each commit of one send until the relay published it."""
    wake = queue_keys(LAG_QUEUE).wake
    one = add.options(connection=conn, queue=LAG_QUEUE)
    lags = []
    for i in range(LAG_SAMPLES):
        client.delete(wake)
        one.send(i, 6)
        conn.commit()
        committed = time.perf_counter()
        if client.blpop([wake], timeout=10) is None:
            raise RuntimeError("the relay published nothing for 10 s")
        lags.append(time.perf_counter() - committed)
    return lags
