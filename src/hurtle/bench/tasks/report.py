"""``hurtle bench tasks``' printed table, its ratios against hurtle's targets, and its JSON
document."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..harness.report import Ratio, notes, over
from ..harness.scenario import Row

HURTLE = "hurtle-redis-solo"


def _rate(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f}/s"


def row_line(row: Row, width: int) -> str:
    if row.skipped:
        return f"{row.name:<{width}}  skipped: {row.skipped}"
    rss = "rss -" if row.rss_peak_mb is None else f"rss {row.rss_peak_mb:,.0f} MB"
    ran = f"ran {row.consumed:,}/{row.count:,}"
    left = "" if row.leftover is None else f", {row.leftover:,} left"
    return (
        f"{row.name:<{width}}  publish {_rate(row.publish_rate):>11}  "
        f"consume {_rate(row.consume_rate):>11}  {rss:>11}  {row.guarantee:<16}  "
        f"{ran}{left}  {row.system} {row.version}: {row.config}{notes(row.notes)}"
    )


def table(rows: list[Row]) -> str:
    width = max((len(r.name) for r in rows), default=10)
    return "\n".join(row_line(r, width) for r in rows)


C, P = "consume", "publish"
#: Stands for the faster of the two funboost rows.
FUNBOOST = "funboost fastest"
#: The ratios under the table, against hurtle's targets: (label, numerator, denominator, lowest
#: acceptable value or ``None`` for information). A side is (row, consume or publish rate).
#: Those on Redis are shown only when ``hurtle-redis-solo`` ran.
ON_REDIS = (
    ("consume: hurtle solo / raw LPOP-count loop", (HURTLE, C), ("raw-batch", C), 0.7),
    ("publish: hurtle send_many / raw pipelined LPUSH", (HURTLE, P), ("raw-batch", P), 0.5),
    (
        "publish: hurtle send_many / raw one LPUSH of 1,000 values",
        (HURTLE, P),
        ("raw-multi", P),
        None,
    ),
    ("consume: hurtle solo / Celery prefork", (HURTLE, C), ("celery-prefork", C), 50),
    ("publish: hurtle send_many / Celery delay()", (HURTLE, P), ("celery-prefork", P), None),
    ("consume: hurtle solo / funboost fastest ({fastest})", (HURTLE, C), (FUNBOOST, C), 3),
    ("consume: hurtle solo / Sidekiq", (HURTLE, C), ("sidekiq", C), 10),
    (
        "consume: hurtle on a 3-master cluster, solo / on one Redis",
        ("hurtle-cluster-solo", C),
        (HURTLE, C),
        0.8,
    ),
    (
        "consume: cluster, 3 queues x 3 processes / cluster solo",
        ("hurtle-cluster-3q", C),
        ("hurtle-cluster-solo", C),
        None,
    ),
    (
        "publish: cluster with ?wait_replicas=1 / cluster",
        ("hurtle-cluster-wait", P),
        ("hurtle-cluster-solo", P),
        None,
    ),
)
#: hurtle on NATS against the raw nats-py fetch/ack loop of the same run.
ON_NATS = (
    (
        "consume: hurtle on NATS solo / raw nats-py fetch-ack loop",
        ("hurtle-nats-solo", C),
        ("raw-nats", C),
        0.5,
    ),
    (
        "publish: hurtle on NATS send_many / raw nats-py publish",
        ("hurtle-nats-solo", P),
        ("raw-nats", P),
        None,
    ),
)


#: hurtle on PostgreSQL against the raw psycopg SKIP LOCKED loop and the PostgreSQL peers of the
#: same run.
ON_POSTGRES = (
    (
        "consume: hurtle on PostgreSQL solo / raw psycopg SKIP LOCKED loop",
        ("hurtle-postgres-solo", C),
        ("raw-postgres", C),
        0.5,
    ),
    (
        "publish: hurtle on PostgreSQL send_many / raw psycopg COPY",
        ("hurtle-postgres-solo", P),
        ("raw-postgres", P),
        0.8,
    ),
    (
        "consume: hurtle on PostgreSQL solo / pgqueuer",
        ("hurtle-postgres-solo", C),
        ("pgqueuer", C),
        5,
    ),
    (
        "consume: hurtle on PostgreSQL solo / procrastinate",
        ("hurtle-postgres-solo", C),
        ("procrastinate", C),
        None,
    ),
)


def ratios(rows: list[Row]) -> list[Ratio]:
    """The ratios of ``ON_REDIS``, ``ON_NATS`` and ``ON_POSTGRES`` whose two rows both ran
    every task."""
    done = {r.name: r for r in reversed(rows) if not r.skipped and r.consumed == r.count}
    funboost = [done[n] for n in ("funboost-redis", "funboost-ack") if n in done]
    fastest = max(funboost, key=lambda r: r.consume_rate or 0.0, default=None)
    if fastest is not None:
        done[FUNBOOST] = fastest

    def rate(side: tuple[str, str]) -> float | None:
        row = done.get(side[0])
        if row is None:
            return None
        return row.consume_rate if side[1] == C else row.publish_rate

    name = fastest.name if fastest else "-"
    every = (*ON_REDIS, *ON_NATS, *ON_POSTGRES) if HURTLE in done else (*ON_NATS, *ON_POSTGRES)
    found = [Ratio(text.format(fastest=name), over(rate(a), rate(b)), t) for text, a, b, t in every]
    return [ratio for ratio in found if ratio.value is not None]


def document(
    machine: dict[str, Any], count: int, rows: list[Row], found: list[Ratio]
) -> dict[str, Any]:
    """The JSON document: the run, the machine, every row and the ratios measured."""
    return {
        "benchmark": "hurtle bench tasks",
        "count": count,
        "machine": machine,
        "rows": [r.to_json() for r in rows],
        "ratios": [dict(dataclasses.asdict(r), verdict=r.verdict) for r in found],
    }


def rss_lines(rows: list[Row]) -> list[str]:
    """Each measured row's worker RSS: at the first task, the peak, at the last sample."""
    return [
        f"{r.name:<22} "
        + " ".join(
            "       -" if mb is None else f"{mb:8.1f}"
            for mb in (r.rss_start_mb, r.rss_peak_mb, r.rss_end_mb)
        )
        for r in rows
        if r.rss_peak_mb is not None
    ]
