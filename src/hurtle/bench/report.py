"""The printed table, the ratios against issue 3's targets, and the JSON document."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .scenario import Row

HURTLE = "hurtle-redis-solo"


@dataclasses.dataclass(frozen=True)
class Ratio:
    label: str
    value: float | None
    #: Lowest acceptable value, or ``None`` for a ratio shown for information.
    target: float | None

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not measured"
        if self.target is None:
            return ""
        return "met" if self.value >= self.target else "MISSED"

    def line(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:,.2f}x"
        target = f"target >= {self.target:g}x" if self.target is not None else "for information"
        return f"{self.label:<58} {value:>10}  {target:<18} {self.verdict}"


def _rate(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f}/s"


def row_line(row: Row, width: int) -> str:
    if row.skipped:
        return f"{row.name:<{width}}  skipped: {row.skipped}"
    rss = "rss -" if row.rss_peak_mb is None else f"rss {row.rss_peak_mb:,.0f} MB"
    ran = f"ran {row.consumed:,}/{row.count:,}"
    left = "" if row.leftover is None else f", {row.leftover:,} left"
    notes = f"  [{'; '.join(row.notes)}]" if row.notes else ""
    return (
        f"{row.name:<{width}}  publish {_rate(row.publish_rate):>11}  "
        f"consume {_rate(row.consume_rate):>11}  {rss:>11}  {row.guarantee:<16}  "
        f"{ran}{left}  {row.system} {row.version}: {row.config}{notes}"
    )


def table(rows: list[Row]) -> str:
    width = max((len(r.name) for r in rows), default=10)
    return "\n".join(row_line(r, width) for r in rows)


def _get(rows: list[Row], name: str) -> Row | None:
    for row in rows:
        if row.name == name and not row.skipped and row.consumed == row.count:
            return row
    return None


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _consume(row: Row | None) -> float | None:
    return row.consume_rate if row else None


def _publish(row: Row | None) -> float | None:
    return row.publish_rate if row else None


def ratios(rows: list[Row]) -> list[Ratio]:
    hurtle = _get(rows, HURTLE)
    if hurtle is None:
        return nats_ratios(rows)
    raw = _get(rows, "raw-batch")
    multi = _get(rows, "raw-multi")
    celery = _get(rows, "celery-prefork")
    sidekiq = _get(rows, "sidekiq")
    funboost = [r for r in (_get(rows, "funboost-redis"), _get(rows, "funboost-ack")) if r]
    fastest = max(funboost, key=lambda r: r.consume_rate or 0.0, default=None)
    return [
        Ratio(
            "consume: hurtle solo / raw LPOP-count loop",
            _over(hurtle.consume_rate, _consume(raw)),
            0.5,
        ),
        Ratio(
            "publish: hurtle send_many / raw pipelined LPUSH",
            _over(hurtle.publish_rate, _publish(raw)),
            0.5,
        ),
        Ratio(
            "publish: hurtle send_many / raw one LPUSH of 1,000 values",
            _over(hurtle.publish_rate, _publish(multi)),
            None,
        ),
        Ratio(
            "consume: hurtle solo / Celery prefork",
            _over(hurtle.consume_rate, _consume(celery)),
            50,
        ),
        Ratio(
            "publish: hurtle send_many / Celery delay()",
            _over(hurtle.publish_rate, _publish(celery)),
            None,
        ),
        Ratio(
            f"consume: hurtle solo / funboost fastest ({fastest.name if fastest else '-'})",
            _over(hurtle.consume_rate, _consume(fastest)),
            3,
        ),
        Ratio("consume: hurtle solo / Sidekiq", _over(hurtle.consume_rate, _consume(sidekiq)), 10),
        Ratio(
            "consume: hurtle on a 3-master cluster, solo / on one Redis",
            _over(_consume(_get(rows, "hurtle-cluster-solo")), hurtle.consume_rate),
            0.8,
        ),
        Ratio(
            "consume: cluster, 3 queues x 3 processes / cluster solo",
            _over(
                _consume(_get(rows, "hurtle-cluster-3q")),
                _consume(_get(rows, "hurtle-cluster-solo")),
            ),
            None,
        ),
        Ratio(
            "publish: cluster with ?wait_replicas=1 / cluster",
            _over(
                _publish(_get(rows, "hurtle-cluster-wait")),
                _publish(_get(rows, "hurtle-cluster-solo")),
            ),
            None,
        ),
        *nats_ratios(rows),
    ]


def nats_ratios(rows: list[Row]) -> list[Ratio]:
    """hurtle on NATS against the raw nats-py fetch/ack loop of the same run."""
    hurtle = _get(rows, "hurtle-nats-solo")
    raw = _get(rows, "raw-nats")
    if hurtle is None or raw is None:
        return []
    return [
        Ratio(
            "consume: hurtle on NATS solo / raw nats-py fetch-ack loop",
            _over(hurtle.consume_rate, _consume(raw)),
            0.5,
        ),
        Ratio(
            "publish: hurtle on NATS send_many / raw nats-py publish",
            _over(hurtle.publish_rate, _publish(raw)),
            None,
        ),
    ]


def write_json(
    path: Path, machine: dict[str, Any], count: int, rows: list[Row], found: list[Ratio]
) -> None:
    document = {
        "benchmark": "hurtle bench tasks",
        "count": count,
        "machine": machine,
        "rows": [r.to_json() for r in rows],
        "ratios": [dict(dataclasses.asdict(r), verdict=r.verdict) for r in found],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
