"""The memory probe of the driver: the RSS of a worker's whole process tree, sampled with psutil,
and each process's ``VmHWM`` (the kernel's own peak), so that a peak between two samples is not
missed. Samples go into a ``Row``: at the first task, the peak, at the last sample, and a series
of (tasks done, MB) for plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .scenario import Row

MB = 1024 * 1024


def _hwm(pid: int) -> float:
    """The kernel's record of a process's peak RSS (``VmHWM``), in bytes; 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def tree_rss(proc: Any) -> tuple[float, float, int]:
    """RSS of a process and all its descendants, the sum of their peaks, and how many."""
    import psutil

    total, peak, n = 0.0, 0.0, 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0.0, 0
    for p in procs:
        try:
            total += p.memory_info().rss
            peak += _hwm(p.pid)
            n += 1
        except psutil.Error:
            pass
    return total, peak, n


def sample(row: Row, ps: Any, done: int, step: int) -> None:
    """Record one sample of ``ps``'s tree in ``row`` after ``done`` tasks; the series keeps one
    point per ``step`` tasks."""
    rss, hwm, n = tree_rss(ps)
    if not n:
        return
    mb = rss / MB
    row.rss_peak_mb = max(row.rss_peak_mb or 0.0, mb, hwm / MB)
    if done:
        if row.rss_start_mb is None:
            row.rss_start_mb = mb
        row.rss_end_mb = mb
        if not row.rss_series or done - row.rss_series[-1][0] >= step:
            row.rss_series.append((done, round(mb, 1)))
