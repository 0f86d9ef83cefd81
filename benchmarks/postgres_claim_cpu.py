"""The PostgreSQL server's CPU per statement of a solo worker's claim loop, and of the raw loop.

Publishes N ``bench.add`` calls to the schema ``claimcpu`` (dropped first), then runs the
statements of ``ack_and_fetch`` one by one on one connection (settle the last batch, worker row,
advisory lock, due delayed rows, plan pin, claim, commit) until the queue is empty, reading the
backend's CPU time from ``/proc/<pid>/schedstat`` around each (the server must run on this
host). Then the raw loop's ``DELETE … SKIP LOCKED … RETURNING body`` over N rows in a table of
its own. CPU time, unlike wall time, hardly moves with the machine's load.

    python benchmarks/postgres_claim_cpu.py [N] [postgresql://user@host/database]
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Any

import psycopg

from hurtle.brokers.postgres.sql import Sql, holder_key, id_array

SCHEMA = "claimcpu"
WORKER = "postgres-123-0123456789abcdefghijkl"


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def hurtle_loop(url: str, count: int) -> None:
    os.environ["HURTLE_BROKER_URL"] = f"{url}?schema={SCHEMA}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    from hurtle.bench.peers import hurtle_app

    hurtle_app.publish(count, lambda sent: None)
    sql = Sql(SCHEMA)
    conn = psycopg.connect(url, autocommit=True)
    pid = conn.info.backend_pid
    cur = conn.cursor(binary=True)
    spent: collections.Counter[str] = collections.Counter()

    def run(name: str, statement: Any, params: Any = None) -> list[Any]:
        before = cpu_of(pid)
        cur.execute(statement, params)
        rows = cur.fetchall() if cur.description else []
        spent[name] += cpu_of(pid) - before
        return rows

    settle: list[int] = []
    batches = 0
    started = time.perf_counter()
    while True:
        run("begin", "BEGIN")
        if settle:
            run("settle", sql.SETTLE, (id_array(settle), WORKER))
        run("worker row", sql.ADD_WORKER, (WORKER, 10.0))
        run("advisory lock", sql.SHARE_KEY, (holder_key(SCHEMA, WORKER),))
        run("due delayed rows", sql.PROMOTE, (["default"],))
        run("plan pin", sql.PIN_CLAIM_PLAN)
        rows = run("claim", sql.CLAIM_ONE, ("default", "default", 1000, WORKER, WORKER))
        run("commit", "COMMIT")
        settle = [r[1] for r in rows]
        if not rows:
            break
        batches += 1
    wall = time.perf_counter() - started
    hot = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = 'messages'",
        (SCHEMA,),
    ).fetchone()
    conn.close()
    print(f"hurtle: {batches} batches in {wall:.2f}s wall; server CPU per batch of 1,000:")
    for name, seconds in spent.items():
        print(f"  {name:18s} {seconds * 1e3 / batches:6.2f} ms")
    print(f"  {'total':18s} {sum(spent.values()) * 1e3 / batches:6.2f} ms")
    print(f"  updates / HOT updates so far (statistics lag): {hot}")


def raw_loop(url: str, count: int) -> None:
    from hurtle.bench.peers.raw_loop import message

    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA}_raw CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}_raw")
    table = f"{SCHEMA}_raw.t"
    conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, body bytea)")
    with conn.cursor() as cur:
        for _ in range(count // 1000):
            with (
                conn.transaction(),
                cur.copy(f"COPY {table} (body) FROM STDIN (FORMAT BINARY)") as cp,
            ):
                cp.set_types(["bytea"])
                for _ in range(1000):
                    cp.write_row((message(),))
    claim = (
        f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT 1000 "
        "FOR UPDATE SKIP LOCKED) RETURNING body"
    )
    pid = conn.info.backend_pid
    before = cpu_of(pid)
    started = time.perf_counter()
    batches = 0
    with conn.cursor(binary=True) as cur:
        while cur.execute(claim).fetchall():  # type: ignore[arg-type]
            batches += 1
    wall = time.perf_counter() - started
    print(
        f"raw: {batches} batches in {wall:.2f}s wall; server CPU per batch of 1,000: "
        f"{(cpu_of(pid) - before) * 1e3 / max(batches, 1):.2f} ms"
    )
    conn.execute(f"DROP SCHEMA {SCHEMA}_raw CASCADE")
    conn.close()


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    url = sys.argv[2] if len(sys.argv) > 2 else "postgresql://postgres@127.0.0.1:5432/postgres"
    hurtle_loop(url, count)
    raw_loop(url, count)
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
