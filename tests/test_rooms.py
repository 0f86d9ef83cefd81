"""Rooms of one noun (docs/architecture.md): every module of ``src/hurtle`` stays under
``MOST_LINES`` lines and opens with a docstring that says its one job.

A module that grows past the limit holds a second job: split it (a mixin, a module of functions
beside it) rather than raise the limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "hurtle"
#: The most lines a module of the package may have.
MOST_LINES = 500


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_is_over_the_limit() -> None:
    over = {
        str(p.relative_to(SRC)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    }
    assert not over, f"modules over {MOST_LINES} lines (split out their second job): {over}"


def test_every_module_opens_with_a_sentence_of_its_job() -> None:
    silent = [
        str(p.relative_to(SRC))
        for p in modules()
        if not (ast.get_docstring(ast.parse(p.read_text())) or "").strip()
    ]
    assert not silent, f"modules without a docstring saying their job: {silent}"
