"""Row ``raw-postgres``: the raw psycopg ``SKIP LOCKED`` loop of ``peers.raw_postgres``, on the
database of ``--broker-url postgresql://`` (skipped without one)."""

from __future__ import annotations

from ...peers import raw_postgres
from ..common import POSTGRES_INSTALL, raw_row

ROWS = [
    raw_row(
        raw_postgres,
        "psycopg",
        "not acknowledged",
        "COPY 1000 rows per transaction / DELETE … FOR UPDATE SKIP LOCKED LIMIT 1000 "
        "RETURNING body",
        store="postgres",
        module="psycopg",
        install=POSTGRES_INSTALL,
    ),
]
