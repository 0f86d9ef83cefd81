"""CPU instructions a message of the worker, per row of ``hurtle bench features``: a measure the
machine's noise does not move, beside the bench's wall-clock ratios.

For each row, N1 then N2 calls of ``bench.add`` are published to a private redis-server and one
``hurtle worker --burst`` consumes them under ``valgrind --tool=callgrind --separate-threads=yes``;
(instructions at N2 - instructions at N1) / (N2 - N1) is what a message costs, the worker's
startup taken off. Reported per thread (the main thread runs the tasks; the acker settles them)
and in all, with each row's ratio to ``bare`` (bare's instructions over the row's). Repeats of one
row agree within about 7%. Needs valgrind; each row takes a minute or two.

    PYTHONPATH=src python benchmarks/feature_instructions.py [N1 N2] [--only row,row]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import redis
from hurtle.bench.features.rows import BARE, ROWS
from hurtle.bench.harness.scenario import Scenario
from hurtle.bench.harness.servers import RedisServer


def totals(directory: Path) -> dict[str, int]:
    """Instructions per output file of one callgrind run: ``out`` (nothing), ``out-01`` (the
    main thread), ``out-02`` ... (threads in the order they started)."""
    found = {}
    for path in sorted(directory.glob("out*")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                found[path.name] = int(line.split()[1])
                break
    return found


def measure(url: str, row: Scenario, n: int) -> dict[str, int]:
    """Publish ``n`` calls and consume them under callgrind, with the commands and environment
    ``hurtle bench features`` runs the row with (the worker with ``--burst``)."""
    env = {**os.environ, "HURTLE_BROKER_URL": url, **row.env}
    values = {"python": sys.executable, "count": str(n)}
    redis.Redis.from_url(url).flushall()
    subprocess.run(
        [part.format(**values) for part in row.publisher],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with tempfile.TemporaryDirectory(prefix="hurtle-callgrind-") as tmp:
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={tmp}/out",
                *(part.format(**values) for part in row.worker),
                "--burst",
            ],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return totals(Path(tmp))


def main(argv: list[str]) -> int:
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    only = set()
    if "--only" in argv:
        at = argv.index("--only")
        only = set(argv[at + 1].split(","))
        argv = argv[:at] + argv[at + 2 :]
    small, large = (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (20_000, 60_000)
    rows = [r for r in ROWS if not only or r.name in only or r is BARE]
    server = RedisServer()
    results = []
    try:
        for feature in rows:
            print(f"-- {feature.name}", file=sys.stderr, flush=True)
            row = feature.scenario()
            a = measure(server.url, row, small)
            b = measure(server.url, row, large)
            span = large - small
            main_thread = (b.get("out-01", 0) - a.get("out-01", 0)) / span
            everything = (sum(b.values()) - sum(a.values())) / span
            results.append((feature.name, main_thread, everything - main_thread, everything))
    finally:
        server.stop()
    bare = results[0][3]
    print(
        f"instructions a message ({small:,} and {large:,} messages per row), worker under callgrind"
    )
    print(f"{'row':<14} {'main thread':>12} {'other threads':>14} {'all':>10} {'bare / row':>11}")
    for name, main_thread, others, everything in results:
        print(
            f"{name:<14} {main_thread:>12,.0f} {others:>14,.0f} {everything:>10,.0f} "
            f"{bare / everything:>11.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
