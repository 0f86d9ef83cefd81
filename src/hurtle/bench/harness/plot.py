"""``--plot FILE.png``: matplotlib (headless) for every suite's chart (``chart``), and the chart of
the publish-then-consume rows: horizontal bars of consume and publish tasks/s per row, log scale."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .scenario import Row

NOT_INSTALLED = "matplotlib is not installed: pip install -e '.[bench]'"

_Measured = TypeVar("_Measured")


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend, or ``None`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def chart(
    measured: Sequence[_Measured],
    path: Path,
    title: str,
    draw: Callable[[Any, Sequence[_Measured]], tuple[Any, Any]],
) -> str | None:
    """Write to ``path`` the chart that ``draw(pyplot, measured)`` makes (returning its figure and
    axes), titled ``title``; returns why it was not written, or ``None``."""
    plt = pyplot()
    if plt is None:
        return NOT_INSTALLED
    if not measured:
        return "no row was measured"
    fig, ax = draw(plt, measured)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def plot(rows: list[Row], path: Path, title: str) -> str | None:
    """Write the chart; returns why it was not written, or ``None``."""
    measured = [r for r in rows if not r.skipped and (r.consume_rate or r.publish_rate)]
    return chart(measured, path, title, _bars)


def _bars(plt: Any, measured: Sequence[Row]) -> tuple[Any, Any]:
    names = [r.name for r in measured][::-1]
    consume = [r.consume_rate or 0.0 for r in measured][::-1]
    publish = [r.publish_rate or 0.0 for r in measured][::-1]
    height = 0.38
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(measured) + 1.4), dpi=90)
    ys = range(len(names))
    ax.barh([y + height / 2 for y in ys], consume, height, label="consume", color="#2b6cb0")
    ax.barh([y - height / 2 for y in ys], publish, height, label="publish", color="#dd8452")
    for y, (c, p) in enumerate(zip(consume, publish, strict=True)):
        if c:
            ax.text(c * 1.05, y + height / 2, f"{c:,.0f}", va="center", fontsize=7)
        if p:
            ax.text(p * 1.05, y - height / 2, f"{p:,.0f}", va="center", fontsize=7)
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tasks/s (log scale)")
    ax.legend(loc="lower right", fontsize=8)
    lowest = min(v for v in consume + publish if v)
    ax.set_xlim(left=10 ** math.floor(math.log10(lowest)), right=max(consume + publish) * 4)
    return fig, ax
