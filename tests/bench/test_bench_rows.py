"""A benchmark row is one declaration in one module: each suite finds its rows in their modules,
in table order, and a module dropped into a rows package is a row that runs through the harness
like any other. Nothing here looks at timings."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hurtle.bench.harness import registry
from hurtle.cli import main
from hurtle.errors import ConfigurationError

SUITES = ("hurtle.bench.tasks.rows", "hurtle.bench.pubsub.rows")

#: A whole new row of ``hurtle bench tasks``: its publisher, its worker and its declaration.
TINY_ROW = '''
"""Row ``tiny``: one RPUSH of every task, one BLPOP per task."""

import os
import sys

from hurtle.bench.harness.scenario import PY, Scenario, publisher

HERE = os.path.dirname(os.path.abspath(__file__))


def publish(count, progress):
    import redis

    client = redis.Redis.from_url(os.environ["HURTLE_BENCH_REDIS_URL"])
    client.rpush("tiny", *range(count))
    progress(count)
    return count


def consume(count):
    import redis

    from hurtle.bench.harness.probe import hit
    from hurtle.bench.peers.raw_loop import stay_up

    client = redis.Redis.from_url(os.environ["HURTLE_BENCH_REDIS_URL"])
    done = 0
    while done < count:
        if client.blpop(["tiny"], timeout=1) is not None:
            hit()
            done += 1
    stay_up()


ROWS = [
    Scenario(
        name="tiny",
        system="a tiny loop",
        guarantee="not acknowledged",
        config="RPUSH of every task / BLPOP each",
        publisher=publisher("tiny_row:publish"),
        worker=(PY, "-m", "tiny_row", "{count}"),
        env={"PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))},
        modules=("redis",),
    )
]

if __name__ == "__main__":
    consume(int(sys.argv[1]))
'''


@pytest.mark.parametrize("package", SUITES)
def test_each_suite_finds_every_row_in_the_module_that_declares_it(package: str) -> None:
    rows = registry.discover(package)
    declared = []
    for name in registry.modules(package):
        module = importlib.import_module(name)
        assert module.ROWS, f"{name} declares no row"
        declared += [row.name for row in module.ROWS]
    assert [row.name for row in rows] == declared
    assert len(set(declared)) == len(declared)
    # every module of the package is a rows module, in the package's ORDER
    pkg = importlib.import_module(package)
    found = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    assert [name.rsplit(".", 1)[1] for name in registry.modules(package)] == list(pkg.ORDER)
    assert found == set(pkg.ORDER)


def test_the_tables_keep_their_order() -> None:
    tasks = [row.name for row in registry.discover("hurtle.bench.tasks.rows")]
    assert tasks[:4] == ["raw-single", "raw-batch", "raw-multi", "hurtle-redis-solo"]
    assert tasks[-1] == "sidekiq"
    pubsub = [row.name for row in registry.discover("hurtle.bench.pubsub.rows")]
    assert pubsub == [
        "hurtle-buffered",
        "hurtle-buffer0",
        "redis-publish",
        "redis-pipelined",
        "zmq-proxy",
        "nats",
    ]


@pytest.fixture
def tiny_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tiny_row.py`` written into a folder that is added to ``tasks/rows/``: a row added as
    one new file, and nothing else."""
    (tmp_path / "tiny_row.py").write_text(textwrap.dedent(TINY_ROW))
    rows = importlib.import_module("hurtle.bench.tasks.rows")
    monkeypatch.setattr(rows, "__path__", [*rows.__path__, str(tmp_path)])
    try:
        yield tmp_path
    finally:
        sys.modules.pop("hurtle.bench.tasks.rows.tiny_row", None)


def test_a_row_added_as_one_module_is_listed_after_the_ordered_ones(tiny_row: Path) -> None:
    names = [row.name for row in registry.discover("hurtle.bench.tasks.rows")]
    assert names[-2:] == ["sidekiq", "tiny"]


def test_a_row_added_as_one_module_runs_through_the_harness(
    tiny_row: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psutil")
    out = tiny_row / "bench.json"
    code = main(
        [
            *("bench", "tasks", "--only", "tiny", "--count", "20", "--redis-url", redis_url),
            "--yes",
            *("--json", str(out), "--workdir", str(tiny_row / "work")),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    (row,) = json.loads(out.read_text())["rows"]
    assert row["name"] == "tiny" and row["skipped"] is None, row
    assert row["published"] == 20 and row["consumed"] == 20
    assert row["worker_processes"] == 1
    assert "tiny  " in printed and "a tiny loop" in printed


def test_a_row_declared_twice_is_refused_with_both_places(tiny_row: Path) -> None:
    (tiny_row / "tiny_again.py").write_text("from hurtle.bench.tasks.rows.tiny_row import ROWS\n")
    try:
        with pytest.raises(ConfigurationError, match="'tiny' is declared twice") as raised:
            registry.discover("hurtle.bench.tasks.rows")
        assert "rows.tiny_again and hurtle.bench.tasks.rows.tiny_row" in str(raised.value)
    finally:
        sys.modules.pop("hurtle.bench.tasks.rows.tiny_again", None)
