"""``hurtle bench tasks`` runs end to end: it starts its own Redis, runs the rows it is asked
for and writes a JSON report in which every task was counted. Nothing here looks at timings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("redis")
pytest.importorskip("psutil")
if shutil.which("redis-server") is None:
    pytest.skip("redis-server is not on PATH", allow_module_level=True)


def test_bench_tasks_runs_the_asked_rows_and_counts_every_task(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hurtle",
            "bench",
            "tasks",
            "--count",
            "2000",
            "--only",
            "raw-batch,hurtle-redis-solo",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert set(rows) == {"raw-batch", "hurtle-redis-solo"}
    for row in rows.values():
        assert row["skipped"] is None, row
        assert row["published"] == 2000
        assert row["consumed"] == 2000
        assert row["leftover"] == 0
    assert rows["hurtle-redis-solo"]["guarantee"] == "acknowledged"
    assert report["machine"]["redis"]
    assert "hurtle-redis-solo" in result.stdout and "consume" in result.stdout


def test_bench_tasks_names_the_rows_it_knows_when_given_an_unknown_one() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hurtle", "bench", "tasks", "--only", "no-such-row"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "no-such-row" in result.stderr and "hurtle-redis-solo" in result.stderr
