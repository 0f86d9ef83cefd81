"""``hurtle bench io``: every worker pool at high concurrency on real I/O, sleeps and CPU work.

Seed 002's experiment, for workers: 500 requests in flight, each a Redis ``INCR`` and ``GET``;
there, the sync model failed requests and restarted workers while gevent and eventlet served five
times more with none failing. Here, for each variant (``io_tasks``) and each pool, a real
``hurtle worker --concurrency 500`` process (or ``--processes 2``) is started on the benchmark's
own Redis and waited for; then ``count`` tasks are sent in batches and the clock runs until the
last one finishes. A row reports tasks/s, failures (dead letters, and tasks that never ran) and
p50/p99 of the time from send to finish, measured in the workers.

Rows: ``io`` and ``sleep`` for every pool, then ``--processes 2`` of the best pool; ``cpu`` for
solo with one and with two processes. The solo pool runs a tenth of the tasks in the ``sleep``
variant (10 ms each, one at a time, the full count would take minutes); rates are comparable,
its latencies are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..app import Hurtle
from ..cli._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm_flush
from ..cli._progress import Progress
from ..errors import ConfigurationError
from ..worker.executors import POOLS

TARGETS = {"sleep": 50.0, "cpu": 1.6}


@dataclasses.dataclass
class IoRow:
    variant: str
    pool: str
    processes: int
    concurrency: int
    count: int
    seconds: float = 0.0
    ran: int = 0
    dead: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    skipped: str = ""

    @property
    def name(self) -> str:
        return self.pool if self.processes == 1 else f"{self.pool} x{self.processes}"

    @property
    def rate(self) -> float:
        return self.ran / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> int:
        """Dead letters plus tasks that never ran."""
        return self.dead + max(self.count - self.ran, 0)


def add_parser(kinds: Any) -> None:
    io: argparse.ArgumentParser = kinds.add_parser(
        "io",
        help="every worker pool at concurrency 500 on Redis I/O, sleeps and CPU work",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    io.add_argument(
        "--count", "-n", type=int, default=20_000, help="tasks per row (default 20,000)"
    )
    io.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=500,
        help="tasks in flight per worker process (default 500)",
    )
    io.add_argument(
        "--redis-url",
        default=None,
        help="use this Redis instead of starting one; its database is FLUSHED before every row",
    )
    io.add_argument(
        "--variants",
        default="io,sleep,cpu",
        help="comma-separated variants (default: io,sleep,cpu)",
    )
    io.add_argument(
        "--pools",
        default=",".join(POOLS),
        help="comma-separated pools for io and sleep (default: all)",
    )
    io.add_argument("--json", type=Path, default=None, help="write rows and machine here")
    io.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")
    io.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one row may take (default 600)"
    )
    add_yes(io, "flush --redis-url")
    io.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from . import io_tasks, machine  # io_tasks makes its app on import: not when parsing
    from .redis_server import RedisServer

    if args.count < 10 or args.concurrency < 1:
        raise ConfigurationError("--count must be at least 10 and --concurrency at least 1")
    variants = _choose(args.variants, io_tasks.VARIANTS, "variant")
    pools = _choose(args.pools, POOLS, "pool")
    if not confirm_flush([args.redis_url], yes=args.yes):
        return EXIT_NOT_CONFIRMED
    server = None if args.redis_url else RedisServer()
    url = args.redis_url or (server.url if server else "")
    try:
        info = machine.describe(url)
        bench = IoBench(url, args.concurrency, args.timeout)
        rows = bench.run_all(variants, pools, args.count)
    finally:
        if server is not None:
            server.stop()
    print(
        f"hurtle bench io: {args.count:,} tasks per row, concurrency {args.concurrency} per "
        f"process; {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, Python "
        f"{info['python']}, Redis {info['redis']}, {info['date']}"
    )
    print(table(rows))
    lines = ratios(rows)
    if lines:
        print("\nratios (same run):")
        for line in lines:
            print("  " + line)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "count": args.count,
                    "concurrency": args.concurrency,
                    "rows": [
                        dataclasses.asdict(r) | {"rate": r.rate, "failed": r.failed} for r in rows
                    ],
                    "ratios": lines,
                },
                indent=2,
            )
        )
        print(f"\nwrote {args.json}")
    if args.plot:
        why = plot(
            rows,
            args.plot,
            f"hurtle bench io: concurrency {args.concurrency}, "
            f"{info['cores']} cores, Redis {info['redis']}",
        )
        print(f"plot: {why}" if why else f"wrote {args.plot}")
    return 0 if all(r.skipped or r.failed == 0 for r in rows) else 1


def _choose(text: str, known: tuple[str, ...], what: str) -> list[str]:
    chosen = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown or not chosen:
        raise ConfigurationError(
            f"unknown {what}(s) {', '.join(unknown) or text!r}: choose from {', '.join(known)}"
        )
    return chosen


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
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushdb()
        client.close()
        with tempfile.TemporaryDirectory(prefix="hurtle-bench-io-") as tmp:
            out = Path(tmp)
            log = out / "worker.log"
            worker = self._start_worker(pool, concurrency, processes, out, log)
            try:
                self._wait_ready(worker, log, processes)
                started = self._send(variant, pool, count)
                dead = self._wait_drained(variant, row, worker, log)
            finally:
                _stop(worker)
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
            "hurtle.bench.io_tasks:app",
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
        from . import io_tasks

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


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _calibrate_spins(seconds: float) -> int:
    """Loop iterations of ``io_tasks.spin`` that take about ``seconds`` here."""
    from . import io_tasks

    spins = 10_000
    started = time.perf_counter()
    for _ in range(20):
        io_tasks.spin(spins)
    per_spin = (time.perf_counter() - started) / (20 * spins)
    return max(int(seconds / per_spin), 1)


def table(rows: list[IoRow]) -> str:
    head = (
        f"{'variant':<8} {'pool':<12} {'tasks':>7} {'seconds':>8} {'tasks/s':>9} "
        f"{'failed':>6} {'p50 ms':>8} {'p99 ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.skipped:
            lines.append(f"{r.variant:<8} {r.name:<12} skipped: {r.skipped}")
            continue
        lines.append(
            f"{r.variant:<8} {r.name:<12} {r.count:>7,} {r.seconds:>8.2f} "
            f"{r.rate:>9,.0f} {r.failed:>6} {r.p50_ms:>8.1f} {r.p99_ms:>8.1f}"
        )
    return "\n".join(lines)


def ratios(rows: list[IoRow]) -> list[str]:
    """The issue's targets: pools vs solo on sleeps, two processes vs one on CPU work."""
    out = []
    for variant, target in TARGETS.items():
        mine = [r for r in rows if r.variant == variant and not r.skipped]
        base = next((r for r in mine if r.pool == "solo" and r.processes == 1), None)
        if base is None or base.rate == 0:
            continue
        for r in mine:
            if r is base or (variant == "sleep" and r.processes != 1):
                continue
            x = r.rate / base.rate
            verdict = "ok" if x >= target else "BELOW TARGET"
            out.append(f"{variant}: {r.name} / solo = {x:.1f}x (target >= {target:g}x) {verdict}")
    return out


def plot(rows: list[IoRow], path: Path, title: str) -> str | None:
    """Bars of tasks/s per row, grouped by variant, log scale; returns why not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: pip install -e '.[bench]'"
    measured = [r for r in rows if not r.skipped and r.rate > 0][::-1]
    if not measured:
        return "no row was measured"
    colors = {"io": "#2b6cb0", "sleep": "#dd8452", "cpu": "#55a868"}
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(measured) + 1.4), dpi=90)
    ys = range(len(measured))
    ax.barh(list(ys), [r.rate for r in measured], color=[colors[r.variant] for r in measured])
    for y, r in enumerate(measured):
        ax.text(
            r.rate * 1.05, y, f"{r.rate:,.0f}  (p99 {r.p99_ms:,.0f} ms)", va="center", fontsize=7
        )
    ax.set_yticks(list(ys), [f"{r.variant}: {r.name}" for r in measured], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tasks/s (log scale)")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(right=max(r.rate for r in measured) * 8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
