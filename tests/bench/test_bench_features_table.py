"""``hurtle bench features``' table: each ratio is to the bare runs beside it, then the median."""

from __future__ import annotations

from hurtle.bench.features import rows_of, table
from hurtle.bench.harness.scenario import Row


def _row(name: str, rate: float) -> Row:
    # consume_rate counts consumed - 1 tasks over consume_s
    return Row(name=name, system="hurtle", config="c", consumed=1001, consume_s=1000 / rate)


def test_each_ratio_is_to_the_bare_runs_beside_it() -> None:
    # the machine is twice as fast in the second round, and speeds up within the third: a
    # ratio of medians would say 0.75; each row against the bare runs beside it says 0.5
    rounds = [
        [_row("bare", 100.0), _row("feature", 50.0), _row("bare", 100.0)],
        [_row("bare", 200.0), _row("feature", 100.0), _row("bare", 200.0)],
        [_row("bare", 100.0), _row("feature", 60.0), _row("bare", 140.0)],
    ]
    lines = {line.split()[0]: line.split() for line in table(rounds).splitlines()[1:]}
    assert len(lines) == 2  # each row once, however often it ran
    assert lines["bare"][1:4] == ["120", "1.00", "1.00-1.00"]  # median of all six
    assert lines["feature"][1:4] == ["60", "0.50", "0.50-0.50"]


def test_a_row_with_bare_on_one_side_only_is_compared_with_that_one() -> None:
    rounds = [[_row("bare", 100.0), _row("feature", 70.0)]]
    line = next(x for x in table(rounds).splitlines() if x.startswith("feature"))
    assert line.split()[2] == "0.70"


def test_a_skipped_row_says_why() -> None:
    rounds = [[_row("bare", 100.0), Row(name="x", system="hurtle", skipped="option not available")]]
    text = table(rounds)
    assert "skipped: option not available" in text


def test_only_runs_the_rows_named_in_the_order_given_bare_first() -> None:
    assert [r.name for r in rows_of("throttle,rate_limit")] == ["bare", "throttle", "rate_limit"]
    assert [r.name for r in rows_of("rate_limit, bare,throttle,rate_limit")] == [
        "bare",
        "rate_limit",
        "throttle",
    ]
    assert rows_of("")[0].name == "bare" and len(rows_of("")) > 3
