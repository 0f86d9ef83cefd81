"""PgQueuer side of the benchmark, as its quick start shows it: an asyncpg connection, an
``async`` entrypoint ``add`` whose payload is the JSON ``{"args": [5, 6]}``; published with
``Queries.enqueue`` of lists (its batch insert, 1,000 jobs a call); consumed with the defaults of
``pgq run`` through ``pgqueuer.run``, what that command calls, on uvloop as it picks (the
command itself fails here while parsing its ``--log-level`` under typer 0.29). Its tables live in
the schema ``$PGQUEUER_SCHEMA`` (PgQueuer's own setting) of ``HURTLE_BROKER_URL``'s database,
installed by the publisher with ``Queries.install``.

    python -m hurtle.bench.harness.publish hurtle.bench.peers.pgqueuer_app:publish COUNT
    python -m hurtle.bench.peers.pgqueuer_app
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit

import asyncpg
import pgqueuer
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from ..harness.probe import hit

BATCH = 1000
ENTRYPOINT = "add"


def add(x: int, y: int) -> int:
    hit()
    return x + y


def _dsn() -> str:
    """``HURTLE_BROKER_URL`` without hurtle's ``schema`` option, which asyncpg would send to the
    server as a setting."""
    parts = urlsplit(os.environ["HURTLE_BROKER_URL"])
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return parts._replace(scheme="postgresql", query=urlencode(kept)).geturl()


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` takes: a ``PgQueuer`` with the ``add`` entrypoint."""
    connection = await asyncpg.connect(_dsn())
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def run_add(job: Job) -> None:
        add(*json.loads(job.payload or b"{}")["args"])

    try:
        yield pgq
    finally:
        await connection.close()


async def _publish(count: int, progress: Callable[[int], None]) -> int:
    connection = await asyncpg.connect(_dsn())
    try:
        queries = Queries(AsyncpgDriver(connection))
        if not await queries.schema_is_installed():
            await queries.install()
        sent = 0
        while sent < count:
            n = min(BATCH, count - sent)
            payloads: list[bytes | None] = [json.dumps({"args": [5, 6]}).encode()] * n
            await queries.enqueue([ENTRYPOINT] * n, payloads, [0] * n)
            sent += n
            progress(sent)
        return sent
    finally:
        await connection.close()


def publish(count: int, progress: Callable[[int], None]) -> int:
    return asyncio.run(_publish(count, progress))


def work() -> None:
    """``pgq run hurtle.bench.peers.pgqueuer_app:main`` with its defaults: batch size 10,
    dequeue timeout 30 s, continuous mode, no concurrency limit."""
    if sys.platform != "win32":
        import uvloop

        uvloop.run(pgqueuer.run(main))
    else:
        asyncio.run(pgqueuer.run(main))


if __name__ == "__main__":
    work()
