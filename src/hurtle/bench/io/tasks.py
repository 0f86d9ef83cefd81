"""The tasks ``hurtle bench io`` runs, imported by its ``hurtle worker`` processes.

Each task takes the time its message was sent and, when done, notes that and its own finish time
in this process's memory; at exit the process writes them to ``$HURTLE_BENCH_IO_OUT/<pid>.json``,
so timing costs no round trip per task. Variants (``VARIANTS``), each as a plain ``def`` and as an
``async def`` for the asyncio pool:

* ``io``: a Redis ``INCR`` and ``GET`` on the benchmark's own server, as seed 002's web app does;
* ``sleep``: 10 ms of waiting;
* ``cpu``: a pure-Python loop of ``spins`` iterations (the driver sizes it to about 1 ms).

Broker and Redis come from ``HURTLE_BROKER_URL`` and ``HURTLE_BENCH_IO_REDIS``. Nothing here is
imported by ``hurtle`` itself.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import time
from pathlib import Path
from typing import Any

from ...app import Hurtle

app = Hurtle()
_done: list[tuple[float, float]] = []  # (sent, finished); list.append is atomic in every pool
_clients: dict[str, Any] = {}
#: One connection per task in flight, as many as the largest concurrency asked for (redis-py
#: refuses more than its own default otherwise).
_MAX_CONNECTIONS = 4096


def _redis() -> Any:
    client = _clients.get("sync")
    if client is None:
        import redis

        url = os.environ["HURTLE_BENCH_IO_REDIS"]
        client = _clients["sync"] = redis.Redis.from_url(url, max_connections=_MAX_CONNECTIONS)
    return client


def _async_redis() -> Any:
    client = _clients.get("async")
    if client is None:
        import redis.asyncio

        url = os.environ["HURTLE_BENCH_IO_REDIS"]
        client = _clients["async"] = redis.asyncio.Redis.from_url(
            url, max_connections=_MAX_CONNECTIONS
        )
    return client


def spin(spins: int) -> int:
    total = 0
    for i in range(spins):
        total += i * i % 7
    return total


@app.task(name="bench.io.io", retries=0)
def io(sent: float) -> None:
    r = _redis()
    r.incr("bench:hits")
    r.get("bench:hits")
    _done.append((sent, time.time()))


@app.task(name="bench.io.io_async", retries=0)
async def io_async(sent: float) -> None:
    r = _async_redis()
    await r.incr("bench:hits")
    await r.get("bench:hits")
    _done.append((sent, time.time()))


@app.task(name="bench.io.sleep", retries=0)
def sleep(sent: float) -> None:
    time.sleep(0.01)
    _done.append((sent, time.time()))


@app.task(name="bench.io.sleep_async", retries=0)
async def sleep_async(sent: float) -> None:
    await asyncio.sleep(0.01)
    _done.append((sent, time.time()))


@app.task(name="bench.io.cpu", retries=0)
def cpu(sent: float, spins: int) -> None:
    spin(spins)
    _done.append((sent, time.time()))


@app.task(name="bench.io.cpu_async", retries=0)
async def cpu_async(sent: float, spins: int) -> None:
    spin(spins)
    _done.append((sent, time.time()))


VARIANTS = ("io", "sleep", "cpu")


def task_name(variant: str, pool: str) -> str:
    """The task a pool runs for a variant: ``async def`` on asyncio, plain ``def`` elsewhere."""
    return f"bench.io.{variant}_async" if pool == "asyncio" else f"bench.io.{variant}"


@atexit.register
def _write_timings() -> None:
    out = os.environ.get("HURTLE_BENCH_IO_OUT")
    if out:
        path = Path(out) / f"{os.getpid()}.json"
        path.write_text(json.dumps(_done))
