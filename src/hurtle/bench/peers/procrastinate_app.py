"""Procrastinate side of the benchmark, as its quick start shows it: an ``App`` on a
``PsycopgConnector``, a plain (sync) task ``add``; published with ``add.batch_defer`` (its bulk
defer, 1,000 jobs a call); consumed by ``procrastinate worker`` with its defaults. Its tables and
functions live in the schema ``$HURTLE_BENCH_SCHEMA`` of ``HURTLE_BROKER_URL``'s database (the
connections' ``search_path``), applied by the publisher with ``schema_manager.apply_schema``.

    python -m hurtle.bench.harness.publish hurtle.bench.peers.procrastinate_app:publish COUNT
    python -m procrastinate --app hurtle.bench.peers.procrastinate_app.app worker
"""

from __future__ import annotations

import os
from collections.abc import Callable

import psycopg
from procrastinate import App, PsycopgConnector

from ...brokers.postgres.connection import parse_url
from ..harness.probe import hit

BATCH = 1000
SCHEMA = os.environ["HURTLE_BENCH_SCHEMA"]

app = App(
    connector=PsycopgConnector(
        conninfo=parse_url(os.environ["HURTLE_BROKER_URL"])[0],
        kwargs={"options": f"-c search_path={SCHEMA}"},
    )
)


@app.task(name="add")
def add(x: int, y: int) -> int:
    hit()
    return x + y


def publish(count: int, progress: Callable[[int], None]) -> int:
    with psycopg.connect(parse_url(os.environ["HURTLE_BROKER_URL"])[0], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"')
    with app.open():
        app.schema_manager.apply_schema()
        sent = 0
        while sent < count:
            n = min(BATCH, count - sent)
            add.batch_defer(*[{"x": 5, "y": 6}] * n)
            sent += n
            progress(sent)
    return sent
