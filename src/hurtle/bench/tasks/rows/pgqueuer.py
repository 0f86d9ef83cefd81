"""Row ``pgqueuer``: PgQueuer (``peers.pgqueuer_app``) on the database of ``--broker-url
postgresql://`` (skipped without one), in the schema ``bench_pgqueuer``, with the defaults of
``pgq run``; acknowledged (a job is deleted once done, and one whose worker stops beating is
picked again)."""

from __future__ import annotations

from ...harness.scenario import BENCH_EXTRA, PY, Scenario, publisher
from ...harness.servers import POSTGRES_SCHEMAS
from ..leftover import postgres_count

SCHEMA = POSTGRES_SCHEMAS[2]
INSTALL = f"{BENCH_EXTRA} (or pip install 'pgqueuer[asyncpg]')"

ROWS = [
    Scenario(
        name="pgqueuer",
        system="PgQueuer",
        guarantee="acknowledged",
        config="asyncpg driver, async entrypoint, 1 process on uvloop with the defaults of "
        "pgq run (dequeue batch 10, continuous mode, no concurrency limit, durable tables); "
        "published with Queries.enqueue of lists of 1000",
        publisher=publisher("hurtle.bench.peers.pgqueuer_app:publish"),
        worker=(PY, "-m", "hurtle.bench.peers.pgqueuer_app"),
        env={"PGQUEUER_SCHEMA": SCHEMA},
        store="postgres",
        modules=("pgqueuer", "asyncpg"),
        version_of="pgqueuer",
        install=INSTALL,
        leftover=postgres_count(f"SELECT count(*) FROM {SCHEMA}.pgqueuer"),
    ),
]
