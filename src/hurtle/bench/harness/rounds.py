"""Rounds and interleaving, for suites whose rows are compared with a baseline row of the same
run: the baseline runs before every other row and after the last, in each of R rounds (so that a
noisy moment hits every row alike), and each run of a row is compared with the baseline runs
right beside it. A ratio of medians would mix moments: the machine's speed drifts from one
second to the next."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TypeVar

from .scenario import Row

T = TypeVar("T")


def interleave(rows: Sequence[T], baseline: T) -> list[T]:
    """One round's running order: ``baseline``, then each other row followed by ``baseline``."""
    order = [baseline]
    for row in rows:
        if row != baseline:
            order += [row, baseline]
    return order


def rates(rounds: list[list[Row]], name: str, rate: Callable[[Row], float | None]) -> list[float]:
    """Every measured ``rate`` of the row ``name``, over all rounds."""
    return [r for rows in rounds for row in rows if row.name == name and (r := rate(row))]


def ratios(
    rounds: list[list[Row]],
    name: str,
    baseline: str,
    rate: Callable[[Row], float | None] = lambda row: row.consume_rate,
) -> list[float]:
    """Each run of ``name`` over the mean of the ``baseline`` runs just before and just after
    it, when they ran (1.0 for the baseline itself)."""
    out = []
    for rows in rounds:
        for i, row in enumerate(rows):
            mine = rate(row)
            if row.name != name or not mine:
                continue
            if name == baseline:
                out.append(1.0)
                continue
            beside = [
                b
                for j in (i - 1, i + 1)
                if 0 <= j < len(rows) and rows[j].name == baseline and (b := rate(rows[j]))
            ]
            if beside:
                out.append(mine / statistics.fmean(beside))
    return out
