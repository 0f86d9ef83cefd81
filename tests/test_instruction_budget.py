"""The bare call's instruction budget: a solo worker on the memory broker spends no more CPU
instructions per ``add(5, 6)`` than ``hurtle.bench.instructions.BUDGET`` times ``MARGIN``, counted
by callgrind (repeatable where wall-clock rates are not), so per-call work is seen when it lands.

Skipped without valgrind, and on a Python other than the one the budget was recorded on (an
instruction count is the interpreter's as much as hurtle's)."""

from __future__ import annotations

import shutil
import sys

import pytest

from hurtle.bench import instructions

pytestmark = [
    pytest.mark.skipif(
        shutil.which("valgrind") is None,
        reason="valgrind is not installed (apt-get install valgrind): the instruction budget of "
        "a bare call is not checked",
    ),
    pytest.mark.skipif(
        sys.version_info[:2] != instructions.RECORDED_ON,
        reason=f"the instruction budget was recorded on CPython "
        f"{'.'.join(map(str, instructions.RECORDED_ON))}: counts of another interpreter differ",
    ),
    pytest.mark.timeout(1200),
]


def test_a_bare_call_costs_no_more_instructions_than_its_budget() -> None:
    per_call = instructions.per_call()
    limit = instructions.BUDGET * instructions.MARGIN
    assert per_call <= limit, (
        f"a bare call costs {per_call:,.0f} instructions, over its budget of "
        f"{instructions.BUDGET:,} (+{instructions.MARGIN - 1:.0%}): some change added per-call "
        f"work to the bare path (python -m hurtle.bench.instructions measures it)"
    )


def test_the_consume_it_counts_runs_every_call() -> None:
    assert instructions.consume(300) == 300
