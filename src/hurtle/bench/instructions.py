"""The instruction budget of a bare call: CPU instructions a solo worker spends per ``add(5, 6)``
on the memory broker, counted by callgrind, against the figure recorded here.

Wall-clock rates move by tens of percent on a shared machine; an instruction count does not. So
the per-call work of the bare path is kept by a count: ``consume`` publishes N calls of a task
that uses no feature, on an app whose built-in middleware (results, limits, unique locks) is
registered because another task uses it, and runs a solo burst worker on them. ``per_call`` runs
it under ``valgrind --tool=callgrind`` at two sizes and takes (instructions at N2 - instructions
at N1) / (N2 - N1): the worker's start-up and stop cancel out, what remains is what one more
call costs, fetch, decode, call, acknowledgement and bookkeeping included, in every thread.

``BUDGET`` is that figure as measured when it was last cut (docs/benchmarks-log.md);
``tests/test_instruction_budget.py`` fails when a change makes a bare call cost more than
``MARGIN`` times it, so added per-call work is seen when it lands.

    python -m hurtle.bench.instructions [N1 N2] [--log-level INFO]   # instructions per call
    python -m hurtle.bench.instructions consume N [LEVEL]            # what callgrind runs
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Instructions per bare call (all threads), measured on CPython 3.11.7 x86-64 with
#: ``per_call(SMALL, LARGE)`` on 2026-11-27 (docs/benchmarks-log.md): 26,284.
BUDGET = 26_300
#: How far above ``BUDGET`` a measure may go before the budget test fails.
MARGIN = 1.25
#: The (major, minor) version of the CPython ``BUDGET`` was measured on.
RECORDED_ON = (3, 11)
SMALL, LARGE = 500, 2_500


def consume(count: int, log_level: str = "WARNING") -> int:
    """Publish ``count`` calls of a bare ``add`` and consume them with a solo burst worker on the
    memory broker, in this process, logging at ``log_level`` (``WARNING``: the worker's call log
    is off; ``INFO``: its default); the number of calls run."""
    from ..app import Hurtle

    logging.basicConfig(level=log_level, stream=sys.stderr)

    # acknowledgements flushed per batch of 1,000, as on a machine where a batch takes
    # less than the interval (under callgrind it takes far longer)
    app = Hurtle("memory://", heartbeat_timeout=10, ack_interval_ms=10_000)

    @app.task(name="bench.add")
    def add(x: int, y: int) -> int:
        return x + y

    # registers the built-in results, limits and unique middleware, unused by ``add``
    @app.task(name="bench.kept", store_result=True, rate_limit="1000/s", unique_for=60)
    def kept() -> None:
        return None

    _steady_clock()
    sent = 0
    while sent < count:
        n = min(1000, count - sent)
        add.send_many([(5, 6)] * n)
        sent += n
    worker = app.worker(pool="solo", burst=True)
    worker.run()
    app.close()
    return worker.processed


def _steady_clock() -> None:
    """Give the worker's hot loop and batch sizing a clock that moves one microsecond a read.

    Under callgrind a call takes a hundred times longer than it does, and what the worker
    decides by the clock (the solo pool's batch size, a run's spans of fast calls, the cancel
    screen's bound) would follow: the count would be that of a slow machine, and move with the
    load. With this clock every run decides as an unloaded machine does, the same way each
    time. (A C-level callable: no Python frame per read.)"""
    from ..worker import batch, fetcher, processor, screen
    from ..worker.executors import solo

    clock = functools.partial(next, itertools.count(time.perf_counter(), 1e-6))
    processor._clock = batch._clock = clock
    for module in (fetcher, screen, solo):
        module.perf_counter = clock  # type: ignore[attr-defined]


def instructions(count: int, log_level: str = "WARNING") -> int:
    """Instructions, in all threads, of a process that runs ``consume(count)`` under callgrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="hurtle-callgrind-") as tmp:
        out = Path(tmp) / "out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "hurtle.bench.instructions",
                "consume",
                str(count),
                log_level,
            ],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for line in out.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in callgrind's output {out}")


def per_call(small: int = SMALL, large: int = LARGE, log_level: str = "WARNING") -> float:
    """Instructions one more bare call costs: the difference of two runs over their sizes."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    return (instructions(large, log_level) - instructions(small, log_level)) / (large - small)


def main(argv: list[str]) -> int:
    if argv[:1] == ["consume"]:
        ran = consume(int(argv[1]), *argv[2:3])
        print(ran)
        return 0
    level = "WARNING"
    if "--log-level" in argv:
        at = argv.index("--log-level")
        level = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    small, large = (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (SMALL, LARGE)
    figure = per_call(small, large, level)
    print(
        f"instructions per bare call ({small:,} and {large:,} calls, memory broker, solo, "
        f"logging at {level}): {figure:,.0f}; budget {BUDGET:,} (fails above "
        f"{BUDGET * MARGIN:,.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
