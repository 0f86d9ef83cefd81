"""``hurtle bench pubsub``'s rows as measured (``PubSubRow``), its table, its ratios against
hurtle's targets and its chart."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..harness.plot import chart
from ..harness.report import Ratio, notes


@dataclasses.dataclass
class PubSubRow:
    name: str
    pairs: int
    median_rate: float = 0.0
    sent: int = 0
    received: int = 0
    lost_reported: int | None = None
    reconnects: int = 0
    seconds: float = 0.0
    skipped: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def unaccounted(self) -> int:
        """Messages neither received nor reported lost by any subscriber."""
        return max(self.sent * self.pairs - self.received - (self.lost_reported or 0), 0)

    @property
    def delivered(self) -> float:
        """Share of what every subscriber should have received that it did receive."""
        expected = self.sent * self.pairs
        return self.received / expected if expected else 0.0


def _line(row: PubSubRow) -> str:
    if row.skipped:
        return f"{row.name:<17} C={row.pairs}  skipped: {row.skipped}"
    lost = "-" if row.lost_reported is None else f"{row.lost_reported:,}"
    return (
        f"{row.name:<17} C={row.pairs}  {row.median_rate:>11,.0f} msgs/s per subscriber  "
        f"delivered {row.delivered:6.1%}  sent {row.sent:>11,}  reported lost {lost:>11}  "
        f"unaccounted {row.unaccounted:>11,}  reconnects {row.reconnects}{notes(row.notes)}"
    )


def table(rows: list[PubSubRow]) -> str:
    return "\n".join(_line(r) for r in rows)


def ratios(rows: list[PubSubRow]) -> list[str]:
    """hurtle's targets, from this run: hurtle buffered against zmq at C=1 and Redis rows."""

    def rate(name: str, pairs: int) -> float | None:
        for r in rows:
            if r.name == name and r.pairs == pairs and not r.skipped and r.median_rate:
                return r.median_rate
        return None

    lines = []
    for pairs in sorted({r.pairs for r in rows}):
        mine = rate("hurtle-buffered", pairs)
        if mine is None:
            continue
        for other, target in (
            ("zmq-proxy", 1.0 if pairs == 1 else None),
            ("redis-publish", 1.0),
            ("redis-pipelined", 1.0),
        ):
            theirs = rate(other, pairs)
            if theirs is None:
                continue
            value = mine / theirs
            ratio = Ratio(f"C={pairs} hurtle-buffered / {other:<16}", value, target)
            lines.append(f"{ratio.label} {value:8.2f}x  {ratio.goal:<16} {ratio.verdict}")
    return lines


def plot(rows: list[PubSubRow], path: Path, title: str) -> str | None:
    """Bars of the median msgs/s per subscriber, one group per row, one bar per pair count."""
    return chart([r for r in rows if not r.skipped and r.median_rate], path, title, _bars)


def _bars(plt: Any, measured: Sequence[PubSubRow]) -> tuple[Any, Any]:
    names = list(dict.fromkeys(r.name for r in measured))
    pairs = sorted({r.pairs for r in measured})
    width = 0.8 / len(pairs)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=90)
    for k, c in enumerate(pairs):
        values = [
            next((r.median_rate for r in measured if r.name == n and r.pairs == c), 0.0)
            for n in names
        ]
        xs = [i + k * width for i in range(len(names))]
        ax.bar(xs, values, width, label=f"C={c}")
    ax.set_xticks([i + width * (len(pairs) - 1) / 2 for i in range(len(names))], names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median msgs/s per subscriber (log)")
    ax.legend(fontsize=8)
    return fig, ax
