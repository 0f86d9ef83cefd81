"""Row ``hurtle-postgres-solo``: hurtle on PostgreSQL (``--broker-url postgresql://``), solo."""

from __future__ import annotations

from ..common import hurtle_row

ROWS = [
    hurtle_row(
        "hurtle-postgres-solo",
        "PostgreSQL, solo pool, concurrency 1",
        "--pool",
        "solo",
        store="postgres",
        modules=("psycopg", "psycopg_pool", "hurtle.brokers.postgres"),
        install="pip install -e '.[postgres]' and --broker-url postgresql://user@host/database",
    ),
]
