"""Row ``hurtle-sqlite-solo``: hurtle on a SQLite file in the row's work directory, solo."""

from __future__ import annotations

from ..common import hurtle_row

ROWS = [
    hurtle_row(
        "hurtle-sqlite-solo",
        "SQLite file, solo pool, concurrency 1",
        "--pool",
        "solo",
        store="sqlite",
        modules=("hurtle.brokers.sqlite",),
        install="the SQLite broker (hurtle/brokers/sqlite/)",
    ),
]
