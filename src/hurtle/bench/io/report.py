"""``hurtle bench io``'s rows as measured (``IoRow``), its table, its ratios against hurtle's
targets (pools against solo on sleeps, two processes against one on CPU work) and its chart."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..harness.plot import chart

TARGETS = {"sleep": 50.0, "cpu": 1.6}


@dataclasses.dataclass
class IoRow:
    variant: str
    pool: str
    processes: int
    concurrency: int
    count: int
    seconds: float = 0.0
    ran: int = 0
    dead: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    skipped: str = ""

    @property
    def name(self) -> str:
        return self.pool if self.processes == 1 else f"{self.pool} x{self.processes}"

    @property
    def rate(self) -> float:
        return self.ran / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> int:
        """Dead letters plus tasks that never ran."""
        return self.dead + max(self.count - self.ran, 0)


def table(rows: list[IoRow]) -> str:
    head = (
        f"{'variant':<8} {'pool':<12} {'tasks':>7} {'seconds':>8} {'tasks/s':>9} "
        f"{'failed':>6} {'p50 ms':>8} {'p99 ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.skipped:
            lines.append(f"{r.variant:<8} {r.name:<12} skipped: {r.skipped}")
            continue
        lines.append(
            f"{r.variant:<8} {r.name:<12} {r.count:>7,} {r.seconds:>8.2f} "
            f"{r.rate:>9,.0f} {r.failed:>6} {r.p50_ms:>8.1f} {r.p99_ms:>8.1f}"
        )
    return "\n".join(lines)


def ratios(rows: list[IoRow]) -> list[str]:
    """hurtle's targets: pools vs solo on sleeps, two processes vs one on CPU work."""
    out = []
    for variant, target in TARGETS.items():
        mine = [r for r in rows if r.variant == variant and not r.skipped]
        base = next((r for r in mine if r.pool == "solo" and r.processes == 1), None)
        if base is None or base.rate == 0:
            continue
        for r in mine:
            if r is base or (variant == "sleep" and r.processes != 1):
                continue
            x = r.rate / base.rate
            verdict = "ok" if x >= target else "BELOW TARGET"
            out.append(f"{variant}: {r.name} / solo = {x:.1f}x (target >= {target:g}x) {verdict}")
    return out


def plot(rows: list[IoRow], path: Path, title: str) -> str | None:
    """Bars of tasks/s per row, grouped by variant, log scale; returns why not written."""
    return chart([r for r in rows if not r.skipped and r.rate > 0][::-1], path, title, _bars)


def _bars(plt: Any, measured: Sequence[IoRow]) -> tuple[Any, Any]:
    colors = {"io": "#2b6cb0", "sleep": "#dd8452", "cpu": "#55a868"}
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(measured) + 1.4), dpi=90)
    ys = range(len(measured))
    ax.barh(list(ys), [r.rate for r in measured], color=[colors[r.variant] for r in measured])
    for y, r in enumerate(measured):
        ax.text(
            r.rate * 1.05, y, f"{r.rate:,.0f}  (p99 {r.p99_ms:,.0f} ms)", va="center", fontsize=7
        )
    ax.set_yticks(list(ys), [f"{r.variant}: {r.name}" for r in measured], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tasks/s (log scale)")
    ax.set_xlim(right=max(r.rate for r in measured) * 8)
    return fig, ax
