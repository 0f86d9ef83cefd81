"""Runs the rows of ``hurtle bench io``: for each variant and pool, a real ``hurtle worker`` on
the benchmark's Redis (flushed first), ``count`` tasks sent in batches of 1,000, and the clock
until the queue is drained; the timings come from the workers (``io.tasks``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ...app import Hurtle
from ...cli._progress import Progress
from ...errors import ConfigurationError
from ..harness.processes import stop
from ..harness.servers import flush_redis
from .report import IoRow


class IoBench:
    """Runs rows against one Redis (flushed before each row)."""

    def __init__(self, redis_url: str, concurrency: int, timeout: float) -> None:
        self.url = redis_url
        self.concurrency = concurrency
        self.timeout = timeout
        self.spins = _calibrate_spins(0.001)

    def run_all(self, variants: list[str], pools: list[str], count: int) -> list[IoRow]:
        rows: list[IoRow] = []
        for variant in variants:
            if variant == "cpu":
                plan = [("solo", 1), ("solo", 2)]
            else:
                plan = [(pool, 1) for pool in pools]
            done: list[IoRow] = []
            for pool, processes in plan:
                n = max(count // 10, 10) if (variant, pool) == ("sleep", "solo") else count
                done.append(self.run_row(variant, pool, processes, n))
            if variant != "cpu":
                best = max((r for r in done if not r.skipped), key=lambda r: r.rate, default=None)
                if best is not None:
                    done.append(self.run_row(variant, best.pool, 2, count))
            rows += done
        return rows

    def run_row(self, variant: str, pool: str, processes: int, count: int) -> IoRow:
        concurrency = 1 if pool == "solo" else self.concurrency
        row = IoRow(variant, pool, processes, concurrency, count)
        if pool in ("gevent", "eventlet") and importlib.util.find_spec(pool) is None:
            row.skipped = f"{pool} is not installed"
            print(f"-- {variant} {row.name}: skipped ({row.skipped})", file=sys.stderr)
            return row
        flush_redis(self.url)
        with tempfile.TemporaryDirectory(prefix="hurtle-bench-io-") as tmp:
            out = Path(tmp)
            log = out / "worker.log"
            worker = self._start_worker(pool, concurrency, processes, out, log)
            try:
                self._wait_ready(worker, log, processes)
                started = self._send(variant, pool, count)
                dead = self._wait_drained(variant, row, worker, log)
            finally:
                stop(worker, 60)
            sent_finished = [
                tuple(p) for f in out.glob("*.json") for p in json.loads(f.read_text())
            ]
        row.dead = dead
        row.ran = len(sent_finished)
        if sent_finished:
            row.seconds = max(f for _, f in sent_finished) - started
            latencies = sorted(f - s for s, f in sent_finished)
            row.p50_ms = 1000 * latencies[len(latencies) // 2]
            row.p99_ms = 1000 * latencies[min(int(len(latencies) * 0.99), len(latencies) - 1)]
        print(
            f"-- {variant} {row.name}: {row.rate:,.0f} tasks/s, {row.failed} failed",
            file=sys.stderr,
            flush=True,
        )
        return row

    def _start_worker(
        self, pool: str, concurrency: int, processes: int, out: Path, log: Path
    ) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable,
            "-m",
            "hurtle",
            "--log-level",
            "INFO",
            "worker",
            "hurtle.bench.io.tasks:app",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
        ]
        if processes > 1:
            argv += ["--processes", str(processes)]
        env = dict(
            os.environ,
            HURTLE_BROKER_URL=self.url,
            HURTLE_BENCH_IO_REDIS=self.url,
            HURTLE_BENCH_IO_OUT=str(out),
        )
        with log.open("wb") as f:
            return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)

    def _wait_ready(self, worker: subprocess.Popen[bytes], log: Path, processes: int) -> None:
        deadline = time.monotonic() + 60
        while log.read_text(errors="replace").count(" consuming ") < processes:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise ConfigurationError(f"the bench worker did not start:\n{log.read_text()}")
            time.sleep(0.02)

    def _send(self, variant: str, pool: str, count: int) -> float:
        """Send ``count`` tasks in batches of 1,000; returns when sending began."""
        from . import tasks as io_tasks

        app = Hurtle(self.url)
        name = io_tasks.task_name(variant, pool)
        task = app.task(name=name)(lambda *a: None)
        extra: tuple[Any, ...] = (self.spins,) if variant == "cpu" else ()
        bar = Progress("send", count)
        started = time.time()
        sent = 0
        while sent < count:
            n = min(1000, count - sent)
            now = time.time()
            task.send_many([(now, *extra)] * n)
            sent += n
            bar.update(sent)
        bar.finish(sent)
        app.close()
        return started

    def _wait_drained(
        self, variant: str, row: IoRow, worker: subprocess.Popen[bytes], log: Path
    ) -> int:
        """Wait until nothing is ready or in flight; returns the dead-letter count."""
        app = Hurtle(self.url)
        bar = Progress(f"{variant} {row.name}"[:8], row.count)
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                q = app.broker.stats(["default"])["default"]
                left = q.ready + q.in_flight + q.delayed
                bar.update(row.count - left)
                if left == 0:
                    bar.finish(row.count)
                    return q.dead
                if worker.poll() is not None:
                    raise ConfigurationError(f"the bench worker died:\n{log.read_text()}")
                if time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"row {variant} {row.name} took over {self.timeout:g}s"
                    )
                time.sleep(0.02)
        finally:
            app.close()


def _calibrate_spins(seconds: float) -> int:
    """Loop iterations of ``io_tasks.spin`` that take about ``seconds`` here."""
    from . import tasks as io_tasks

    spins = 10_000
    started = time.perf_counter()
    for _ in range(20):
        io_tasks.spin(spins)
    per_spin = (time.perf_counter() - started) / (20 * spins)
    return max(int(seconds / per_spin), 1)
