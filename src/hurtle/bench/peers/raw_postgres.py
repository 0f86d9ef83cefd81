"""The raw psycopg loop hurtle on PostgreSQL is measured against: one table, batches inserted
with ``COPY`` (1,000 rows a transaction), and a consumer that claims and deletes 1,000 at a time
with ``DELETE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1000) RETURNING body``, then
decodes each message and calls the function it names: what a psycopg user writing a queue by
hand does. Deleting at claim time acknowledges nothing (a consumer that dies loses its batch).

Messages are the raw loops' msgpack maps (``raw_loop``) in the table ``bench_raw`` of the
schema ``bench_raw`` of ``HURTLE_BROKER_URL``'s database.

    python -m hurtle.bench.harness.publish hurtle.bench.peers.raw_postgres:publish COUNT
    python -m hurtle.bench.peers.raw_postgres consume COUNT
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from .raw_loop import BATCH, FUNCTIONS, consumer_main, message

SCHEMA = "bench_raw"
_TABLE = f"{SCHEMA}.bench_raw"
_CLAIM = (
    f"DELETE FROM {_TABLE} WHERE id IN (SELECT id FROM {_TABLE} ORDER BY id LIMIT {BATCH} "
    "FOR UPDATE SKIP LOCKED) RETURNING body"
)


def _connect() -> Any:
    import psycopg

    from ...brokers.postgres.connection import parse_url

    conn = psycopg.connect(parse_url(os.environ["HURTLE_BROKER_URL"])[0], autocommit=True)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (id bigserial PRIMARY KEY, body bytea)")
    return conn


def publish(count: int, progress: Callable[[int], None]) -> int:
    conn = _connect()
    sent = 0
    while sent < count:
        n = min(BATCH, count - sent)
        with (
            conn.transaction(),
            conn.cursor() as cur,
            cur.copy(f"COPY {_TABLE} (body) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(["bytea"])
            for _ in range(n):
                copy.write_row((message(),))
        sent += n
        progress(sent)
    conn.close()
    return sent


def consume(count: int) -> int:
    conn = _connect()
    decode = msgspec.msgpack.decode
    functions = FUNCTIONS
    done = 0
    with conn.cursor(binary=True) as cur:
        while done < count:
            rows = cur.execute(_CLAIM).fetchall()
            if not rows:
                conn.execute("SELECT pg_sleep(0.001)")
                continue
            for (body,) in rows:
                task = decode(body)
                functions[task["task"]](*task["args"])
            done += len(rows)
    return done


def leftover(url: str) -> int | None:
    """Rows still in the table."""
    import psycopg

    from ...brokers.postgres.connection import parse_url

    with psycopg.connect(parse_url(url)[0]) as conn:
        row = conn.execute(f"SELECT count(*) FROM {_TABLE}").fetchone()
    return None if row is None else int(row[0])


if __name__ == "__main__":
    consumer_main(sys.argv[1:], consume)
