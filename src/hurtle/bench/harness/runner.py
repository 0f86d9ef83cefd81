"""Runs one scenario: publish N tasks, then consume them in a worker subprocess, and measure.

Publishing runs in its own process (``hurtle.bench.harness.publish`` or a peer's script), which
times its own loop and writes ``{"count", "seconds"}`` to ``$HURTLE_BENCH_RESULT_FILE`` and its
progress to ``$HURTLE_BENCH_PROGRESS_FILE``. Consuming starts only after publishing ended, with the
queue full: the worker process (and any children it forks) count tasks with ``probe``, and the
consume time is from the first task's finish to the last task's finish, read from the probes, never
from when this driver noticed. Meanwhile the driver samples the RSS of the worker's process tree
with psutil (and reads each process's ``VmHWM``, the kernel's own peak, so a peak between two
samples is not missed) and stops the worker (SIGTERM, then SIGKILL) once every task has run, the
worker exits, it stalls, or the row's time runs out. Every row of ``hurtle bench tasks`` and
``hurtle bench features`` runs through ``Runner.run``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ...cli._progress import Progress
from . import probe, rss, servers
from .processes import spawn, stop_group, tail
from .scenario import Row, Scenario

POLL = 0.05
RSS_EVERY = 0.1
STARTUP_TIMEOUT = 60.0
STALL_TIMEOUT = 20.0
#: Starts one of the row's processes (argv, log file name in its work directory).
_Start = Callable[[tuple[str, ...], str], "subprocess.Popen[bytes]"]


def _fill(argv: tuple[str, ...], values: Mapping[str, str]) -> list[str]:
    return [part.format(**values) for part in argv]


@dataclasses.dataclass
class Runner:
    """Runs scenarios against one Redis URL, each in a fresh work directory under ``root``."""

    redis_url: str
    root: Path
    _: dataclasses.KW_ONLY
    timeout: float = 900.0
    nats_url: str | None = None
    #: ``redis+cluster://…``: where the ``cluster`` rows run (skipped without it)
    cluster_url: str | None = None
    #: ``postgresql://…``: where the ``postgres`` rows run, in schemas of their own
    postgres_url: str | None = None

    def flush(self, scenario: Scenario) -> None:
        """Empty the Redis (and the cluster, when there is one) and, for a NATS row, NATS."""
        servers.flush_redis(self.redis_url)
        if self.cluster_url:
            servers.flush_cluster(self.cluster_url)
        if scenario.store == "nats" and self.nats_url:
            servers.flush_nats(self.nats_url)
        if scenario.store == "postgres" and self.postgres_url:
            servers.flush_postgres(self.postgres_url)

    def broker_url(self, scenario: Scenario, workdir: Path) -> str:
        """The URL the row's publisher and worker get as ``HURTLE_BROKER_URL``."""
        if scenario.store == "cluster":
            return f"{self.cluster_url}{scenario.url_query}"
        if scenario.store == "redis":
            return f"{self.redis_url}{scenario.url_query}"
        if scenario.store == "nats" and self.nats_url:
            return self.nats_url
        if scenario.store == "postgres" and self.postgres_url:
            return servers.postgres_bench_url(self.postgres_url)
        return f"sqlite:///{workdir / 'bench.db'}"

    def missing(self, scenario: Scenario) -> str | None:
        """Why the row cannot run here (a module, a program, a broker), or ``None``."""
        if scenario.store == "nats" and not self.nats_url:
            return "needs a NATS server: --broker-url nats://host:port"
        if scenario.store == "postgres" and not self.postgres_url:
            return "needs a PostgreSQL database: --broker-url postgresql://user@host/database"
        if scenario.store == "cluster" and not self.cluster_url:
            return f"needs {scenario.install}"
        return scenario.missing()

    def run(self, scenario: Scenario, count: int) -> Row:
        asked = count
        if scenario.max_count is not None and count > scenario.max_count:
            count = scenario.max_count
        row = Row(
            name=scenario.name,
            system=scenario.system,
            guarantee=scenario.guarantee,
            config=scenario.config,
            count=count,
            version=scenario.version(),
        )
        missing = self.missing(scenario)
        if missing:
            row.skipped = missing
            return row
        workdir = self.root / scenario.name
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "probe").mkdir(parents=True)
        broker_url = self.broker_url(scenario, workdir)
        env = dict(os.environ)
        if count != asked:
            row.notes.append(f"capped at {count:,} tasks (this row is too slow for {asked:,})")
        env.update(scenario.env)
        env.update(
            HURTLE_BROKER_URL=broker_url,
            HURTLE_BENCH_REDIS_URL=self.redis_url,
            HURTLE_BENCH_PROBE_DIR=str(workdir / "probe"),
            HURTLE_BENCH_PROGRESS_FILE=str(workdir / "publish.progress"),
            HURTLE_BENCH_RESULT_FILE=str(workdir / "publish.json"),
            HURTLE_BENCH_COUNT=str(count),
            PYTHONUNBUFFERED="1",
        )
        if scenario.prepare is not None:
            env.update(scenario.prepare(workdir, self.redis_url))
        values = {
            "python": sys.executable,
            "count": str(count),
            "workdir": str(workdir),
            "redis_url": self.redis_url,
        }

        def start(argv: tuple[str, ...], log: str) -> subprocess.Popen[bytes]:
            return spawn(_fill(argv, values), env=env, cwd=workdir, log=workdir / log)

        self.flush(scenario)
        if not self._publish(scenario, row, workdir, start):
            return row
        self._consume(scenario, row, workdir, start)
        if scenario.leftover is not None:
            try:
                row.leftover = scenario.leftover(broker_url)
            except Exception as err:  # a report, not a verdict: say why it is unknown
                row.notes.append(f"could not read what is left in the queue: {err}")
        if row.consumed != count:
            row.notes.append(f"ran {row.consumed:,} of {count:,} tasks")
        return row

    # -- publishing ------------------------------------------------------------------------

    def _publish(self, scenario: Scenario, row: Row, workdir: Path, start: _Start) -> bool:
        log = workdir / "publish.log"
        bar = Progress(f"{scenario.name} publish", row.count)
        proc = start(scenario.publisher, log.name)
        deadline = time.monotonic() + self.timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL)
            bar.update(self._progress(workdir))
        if proc.poll() is None:
            row.notes.append(f"publishing took longer than {self.timeout:.0f}s: stopped")
        stop_group(proc)
        result_file = workdir / "publish.json"
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError):
            bar.finish(self._progress(workdir))
            row.skipped = f"the publisher failed (exit {proc.returncode}): {tail(log)}"
            return False
        row.published, row.publish_s = int(result["count"]), float(result["seconds"])
        row.notes.extend(result.get("notes", []))
        bar.finish(row.published)
        return True

    @staticmethod
    def _progress(workdir: Path) -> int:
        try:
            return int((workdir / "publish.progress").read_text() or 0)
        except (OSError, ValueError):
            return 0

    # -- consuming -------------------------------------------------------------------------

    def _consume(self, scenario: Scenario, row: Row, workdir: Path, start: _Start) -> None:
        try:
            import psutil
        except ImportError:
            psutil = None
            row.notes.append(f"psutil is missing, so no RSS: {scenario.install}")
        log = workdir / "worker.log"
        probes = workdir / "probe"
        count = row.count
        bar = Progress(f"{scenario.name} consume", count)
        proc = start(scenario.worker, log.name)
        ps = psutil.Process(proc.pid) if psutil is not None else None
        started = time.monotonic()
        last_change, last_count, last_rss = started, 0, 0.0
        seen = probe.read(probes)
        step = max(count // 50, 1)
        while True:
            time.sleep(POLL)
            now = time.monotonic()
            seen = probe.read(probes)
            bar.update(seen["count"])
            if ps is not None and now - last_rss >= RSS_EVERY:
                last_rss = now
                rss.sample(row, ps, seen["count"], step)
            if seen["count"] != last_count:
                last_count, last_change = seen["count"], now
            if seen["count"] >= count:
                if ps is not None:
                    rss.sample(row, ps, seen["count"], step)
                break
            if proc.poll() is not None:
                row.notes.append(f"the worker exited early ({proc.returncode}): {tail(log)}")
                break
            if now - started > self.timeout:
                row.notes.append(f"stopped after {self.timeout:.0f}s")
                break
            idle = now - last_change
            if (last_count and idle > STALL_TIMEOUT) or (not last_count and idle > STARTUP_TIMEOUT):
                row.notes.append(f"no progress for {idle:.0f}s: stopped; {tail(log, 2)}")
                break
        stop_group(proc)
        seen = probe.read(probes)  # the final files, written at exit
        bar.finish(seen["count"])
        row.consumed = seen["count"]
        row.worker_processes = seen["processes"]
        if seen["count"]:
            row.consume_s = seen["last"] - seen["first"]
