"""What every suite prints and writes alike: a ratio against its target and its verdict, the
machine in one line, and a run's output (``show``): title, table, sections of lines, the JSON
document and the plot."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


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

    @property
    def goal(self) -> str:
        return f"target >= {self.target:g}x" if self.target is not None else "for information"

    def line(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:,.2f}x"
        return f"{self.label:<58} {value:>10}  {self.goal:<18} {self.verdict}"


def over(a: float | None, b: float | None) -> float | None:
    """``a / b``, or ``None`` when either was not measured."""
    return a / b if a and b else None


def machine_line(info: dict[str, Any]) -> str:
    """CPU, cores, memory, Python, Redis and date of ``machine.describe``, for a title line."""
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, Python "
        f"{info['python']}, Redis {info['redis']}, {info['date']}"
    )


def _print_lines(heading: str, lines: Sequence[str]) -> None:
    """``heading`` after a blank line, then each line indented; nothing when there are none."""
    if lines:
        print(f"\n{heading}")
        for line in lines:
            print("  " + line)


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {path}")


def _say_plot(path: Path, why_not: str | None) -> None:
    """Where the plot went, or why it was not written."""
    print(f"plot: {why_not}" if why_not else f"wrote {path}")


def notes(row_notes: Sequence[str]) -> str:
    """A row's notes at the end of its table line: ``  [a; b]``, or nothing."""
    return f"  [{'; '.join(row_notes)}]" if row_notes else ""


def show(
    title: str,
    table: str,
    sections: Sequence[tuple[str, Sequence[str]]],
    *,
    json_path: Path | None,
    document: Callable[[], dict[str, Any]],
    plot_path: Path | None,
    chart: Callable[[Path], str | None],
) -> None:
    """Print a run: its title, its table and each (heading, lines) section that has lines; then
    write ``document()`` to ``json_path`` and ``chart(plot_path)`` when they are asked for."""
    print(title)
    print(table)
    for heading, lines in sections:
        _print_lines(heading, lines)
    if json_path:
        _write_json(json_path, document())
    if plot_path:
        _say_plot(plot_path, chart(plot_path))
