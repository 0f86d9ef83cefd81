"""``hurtle bench http`` reads wrk's report right."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import run_hurtle
from hurtle.bench.http import parse_wrk

WRK = """Running 5s test @ http://127.0.0.1:40000/api/queues/bench/messages
  2 threads and 500 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    70.12ms   80.44ms   1.20s    91.50%
    Req/Sec     3.52k   512.11     4.50k    70.00%
  Latency Distribution
     50%   62.00ms
     75%   80.10ms
     90%  120.00ms
     99%  571.60ms
  34940 requests in 5.00s, 6.10MB read
  Socket errors: connect 0, read 3, write 0, timeout 12
  Non-2xx or 3xx responses: 7
Requests/sec:   6988.11
Transfer/sec:      1.22MB
"""


def test_wrk_figures_are_read_with_their_units() -> None:
    assert parse_wrk(WRK) == {
        "requests": 34940,
        "requests_per_s": 6988.11,
        "p50_ms": 62.0,
        "p99_ms": 571.6,
        "non_2xx": 7,
        "socket_errors": {"connect": 0, "read": 3, "write": 0, "timeout": 12},
    }
    assert parse_wrk(WRK.replace("571.60ms", "1.50s"))["p99_ms"] == 1500.0


def test_a_short_run_enqueues_what_it_counts(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")
    out = run_hurtle(
        "bench",
        "http",
        "--duration",
        "1",
        "--connections",
        "20",
        "--json",
        str(tmp_path / "http.json"),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads((tmp_path / "http.json").read_text())["rows"]}
    enqueue = rows["hurtle-enqueue"]
    assert enqueue["requests"] > 0 and enqueue["non_2xx"] == 0
    assert enqueue["enqueued"] >= enqueue["requests"]
    assert rows["redis-incr"]["requests"] > 0
