"""Row ``hurtle-postgres-solo``: hurtle on PostgreSQL (``--broker-url postgresql://``), solo."""

from __future__ import annotations

from ..common import POSTGRES_INSTALL, hurtle_row

ROWS = [
    hurtle_row(
        "hurtle-postgres-solo",
        "PostgreSQL, solo pool, concurrency 1",
        "--pool",
        "solo",
        store="postgres",
        modules=("psycopg", "psycopg_pool", "hurtle.brokers.postgres"),
        install=POSTGRES_INSTALL,
    ),
]
