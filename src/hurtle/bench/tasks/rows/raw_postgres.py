"""Row ``raw-postgres``: the raw psycopg ``SKIP LOCKED`` loop of ``peers.raw_postgres``, on the
database of ``--broker-url postgresql://`` (skipped without one)."""

from __future__ import annotations

from ...harness.scenario import PY, Scenario, publisher
from ...peers import raw_postgres

ROWS = [
    Scenario(
        name="raw-postgres",
        system="raw psycopg",
        guarantee="not acknowledged",
        config="COPY 1000 rows per transaction / DELETE … FOR UPDATE SKIP LOCKED LIMIT 1000 "
        "RETURNING body",
        store="postgres",
        publisher=publisher("hurtle.bench.peers.raw_postgres:publish"),
        worker=(PY, "-m", "hurtle.bench.peers.raw_postgres", "consume", "{count}"),
        modules=("psycopg",),
        version_of="psycopg",
        install="pip install -e '.[postgres]' and --broker-url postgresql://user@host/database",
        leftover=raw_postgres.leftover,
    ),
]
