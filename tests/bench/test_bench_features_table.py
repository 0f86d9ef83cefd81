"""``hurtle bench features``' table: each ratio is taken within a round, then the median."""

from __future__ import annotations

from hurtle.bench.features import table
from hurtle.bench.scenario import Row


def _row(name: str, rate: float) -> Row:
    # consume_rate counts consumed - 1 tasks over consume_s
    return Row(name=name, system="hurtle", config="c", consumed=1001, consume_s=1000 / rate)


def test_each_ratio_is_to_the_bare_row_of_its_own_round() -> None:
    # the machine is twice as fast in the second round: a ratio of medians would say 0.75,
    # each round says 0.5
    rounds = [
        [_row("bare", 100.0), _row("feature", 50.0)],
        [_row("bare", 200.0), _row("feature", 100.0)],
        [_row("bare", 100.0), _row("feature", 60.0)],
    ]
    lines = {line.split()[0]: line.split() for line in table(rounds).splitlines()[1:]}
    assert lines["bare"][1:4] == ["100", "1.00", "1.00-1.00"]
    assert lines["feature"][1:4] == ["60", "0.50", "0.50-0.60"]


def test_a_skipped_row_says_why() -> None:
    rounds = [[_row("bare", 100.0), Row(name="x", system="hurtle", skipped="option not available")]]
    text = table(rounds)
    assert "skipped: option not available" in text
