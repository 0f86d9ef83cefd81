"""``hurtle bench pubsub`` runs end to end on a tiny configuration: it starts its own Redis,
runs the asked rows with real publisher and subscriber processes and writes a JSON report in
which messages were sent and received. Nothing here looks at timings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("redis")
if shutil.which("redis-server") is None:
    pytest.skip("redis-server is not on PATH", allow_module_level=True)


def test_bench_pubsub_runs_the_asked_rows_and_reports_deliveries(tmp_path: Path) -> None:
    out = tmp_path / "pubsub.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hurtle",
            "bench",
            "pubsub",
            "--pairs",
            "1",
            "--duration",
            "1",
            "--channels",
            "5",
            "--only",
            "hurtle-buffered,redis-publish",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert set(rows) == {"hurtle-buffered", "redis-publish"}
    for row in rows.values():
        assert row["skipped"] == "" and row["pairs"] == 1, row
        assert row["sent"] > 0 and 0 < row["received"] <= row["sent"], row
        assert row["median_rate"] > 0
    assert rows["hurtle-buffered"]["lost_reported"] is not None  # hurtle counts its losses
    assert rows["redis-publish"]["lost_reported"] is None  # raw redis-py cannot
    assert report["machine"]["redis"]
    assert "hurtle-buffered" in result.stdout and "msgs/s per subscriber" in result.stdout


def test_bench_pubsub_names_the_rows_it_knows_when_given_an_unknown_one() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hurtle", "bench", "pubsub", "--only", "no-such-row"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "no-such-row" in result.stderr and "hurtle-buffered" in result.stderr
