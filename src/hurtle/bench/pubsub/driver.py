"""Runs one row of ``hurtle bench pubsub``: its broker (when it brings one), then C subscriber and
C publisher processes (``loop``), started together once all are ready, and their reports summed
into a ``PubSubRow``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import queue
import statistics
import time
from contextlib import AbstractContextManager
from typing import Any

from .loop import Client, Setup, run_publisher, run_subscriber
from .report import PubSubRow


def run_row(client: Client, pairs: int, redis_url: str, args: argparse.Namespace) -> PubSubRow:
    """Start the row's own broker where it has one (zmq proxy, nats-server), then the row."""
    setup = Setup(
        system=client.name,
        redis_url=redis_url,
        channels=tuple(f"ch{i:03d}" for i in range(args.channels)),
        payload_size=args.size,
        duration=args.duration,
    )
    broker: AbstractContextManager[dict[str, Any]] = (
        client.broker() if client.broker is not None else contextlib.nullcontext({})
    )
    with broker as fields:
        return measure(client, pairs, dataclasses.replace(setup, **fields))


def measure(client: Client, pairs: int, setup: Setup) -> PubSubRow:
    """One row: start C subscribers and C publishers, wait until all are ready, measure."""
    row = PubSubRow(client.name, pairs, seconds=setup.duration)
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, start = ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(
            target=run_subscriber, args=(client.subscriber, setup, ready, go, start, results)
        )
        for _ in range(pairs)
    ]
    procs += [
        ctx.Process(target=run_publisher, args=(client.publisher, setup, ready, go, start, results))
        for _ in range(pairs)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    try:
        for _ in procs:
            ready.get(timeout=60)
        start.value = time.time() + 0.2
        go.set()
        deadline = time.monotonic() + setup.duration + 120
        while len(reports) < len(procs) and time.monotonic() < deadline:
            try:
                reports.append(results.get(timeout=1))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    subs = [r for r in reports if r["role"] == "subscriber"]
    pubs = [r for r in reports if r["role"] == "publisher"]
    if len(subs) < pairs or len(pubs) < pairs:
        row.notes.append(f"only {len(subs)} subscriber and {len(pubs)} publisher reports came back")
    samples = [n for r in subs for n in r["per_second"]]
    row.median_rate = float(statistics.median(samples)) if samples else 0.0
    row.sent = sum(r["sent"] for r in pubs)
    row.received = sum(r["received"] for r in subs)
    lost = [r["lost"] for r in subs]
    row.lost_reported = None if any(n is None for n in lost) else sum(lost)
    row.reconnects = sum(r["reconnects"] for r in subs)
    errors = sorted({r["error"] for r in pubs if r.get("error")})
    if errors:
        row.notes.append("publisher errors at the end: " + "; ".join(errors))
    slow = sum(r.get("slow_consumer_errors", 0) for r in subs)
    if slow:
        row.notes.append(f"{slow} slow-consumer errors")
    return row
