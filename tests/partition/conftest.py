"""Fixtures of the partition tests: the hosts of a trial in network namespaces, made for each
test and removed after it, failure or not. Without root, ``ip`` or namespaces, every test here
is skipped with the reason.

At the end of a session that ran partition trials, a table of their figures is printed (what
docs/reliability.md records).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
from partition_support import RESULTS, TRIALS, Site


@pytest.fixture(scope="session")
def namespaces_allowed() -> None:
    """Skip unless namespaces can be made here; then remove those left by dead runs."""
    pytest.importorskip("redis")
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    netns.sweep()


@pytest.fixture
def site(namespaces_allowed: None, tmp_path: Path) -> Iterator[Site]:
    s = Site(tmp_path)
    try:
        yield s
    finally:
        s.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    rows: dict[str, list[float]] = {}
    for t in RESULTS:
        row = rows.setdefault(t.scenario, [0, 0, 0, 0, 0, 0, 0, 0, 0.0])
        row[0] += 1
        row[1] += t.tasks
        row[2] += len(t.lost)
        row[3] += t.duplicates
        row[4] += len(t.duplicates_outside)
        row[5] += t.ticks
        row[6] += t.ticks_twice
        row[7] += len(t.ticks_lost)
        row[8] = max(row[8], t.overview_slowest)
    tr = terminalreporter
    tr.section(f"partition trials (HURTLE_CHAOS_TRIALS={TRIALS})")
    tr.write_line(
        "| scenario | trials | tasks | lost | duplicates | duplicates outside the cut "
        "worker's batch | ticks | ticks twice | ticks lost | slowest overview (s) |"
    )
    tr.write_line("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for scenario, row in sorted(rows.items()):
        cells = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in row]
        tr.write_line(f"| {scenario} | " + " | ".join(cells) + " |")
