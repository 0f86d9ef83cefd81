"""Row ``procrastinate``: Procrastinate (``peers.procrastinate_app``) on the database of
``--broker-url postgresql://`` (skipped without one), in the schema ``bench_procrastinate``,
under ``procrastinate worker`` with its defaults; acknowledged (a job is marked succeeded once
done; one whose worker dies stays ``doing`` until retried as a stalled job)."""

from __future__ import annotations

from ...harness.scenario import BENCH_EXTRA, PY, Scenario, publisher
from ...harness.servers import POSTGRES_SCHEMAS
from ..leftover import postgres_count

SCHEMA = POSTGRES_SCHEMAS[3]
INSTALL = f"{BENCH_EXTRA} (or pip install procrastinate)"
#: Procrastinate's worker fetches and finishes one job per query (~50 jobs/s on 2 shared cores):
#: 100,000 would take over half an hour, longer than a row's time.
PROCRASTINATE_MAX = 20_000

ROWS = [
    Scenario(
        name="procrastinate",
        system="Procrastinate",
        guarantee="acknowledged",
        config="psycopg connector, sync task, procrastinate worker with its defaults "
        "(concurrency 1, LISTEN/NOTIFY, finished jobs kept); published with batch_defer "
        "of 1000",
        publisher=publisher("hurtle.bench.peers.procrastinate_app:publish"),
        worker=(
            *(PY, "-m", "procrastinate", "--app", "hurtle.bench.peers.procrastinate_app.app"),
            "worker",
        ),
        env={"HURTLE_BENCH_SCHEMA": SCHEMA},
        store="postgres",
        modules=("procrastinate", "psycopg"),
        version_of="procrastinate",
        install=INSTALL,
        max_count=PROCRASTINATE_MAX,
        leftover=postgres_count(
            f"SELECT count(*) FROM {SCHEMA}.procrastinate_jobs WHERE status IN ('todo', 'doing')"
        ),
    ),
]
