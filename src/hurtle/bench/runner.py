"""Runs one scenario: publish N tasks, then consume them in a worker subprocess, and measure.

Publishing runs in its own process (``hurtle.bench.publish`` or a peer's script), which times its
own loop and writes ``{"count", "seconds"}`` to ``$HURTLE_BENCH_RESULT_FILE`` and its progress to
``$HURTLE_BENCH_PROGRESS_FILE``. Consuming starts only after publishing ended, with the queue
full: the worker process (and any children it forks) count tasks with ``probe``, and the
consume time is from the first task's finish to the last task's finish, read from the probes,
never from when this driver noticed. Meanwhile the driver samples the RSS of the worker's
process tree with psutil (and reads each process's ``VmHWM``, the kernel's own peak, so a peak
between two samples is not missed) and stops the worker (SIGTERM, then SIGKILL) once every task
has run, the worker exits, it stalls, or the row's time runs out.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..cli._progress import Progress
from . import probe
from .scenario import Row, Scenario

POLL = 0.05
RSS_EVERY = 0.1
STARTUP_TIMEOUT = 60.0
STALL_TIMEOUT = 20.0
MB = 1024 * 1024


def _fill(argv: tuple[str, ...], values: Mapping[str, str]) -> list[str]:
    return [part.format(**values) for part in argv]


def _hwm(pid: int) -> float:
    """The kernel's record of a process's peak RSS (``VmHWM``), in bytes; 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _tree_rss(proc: Any) -> tuple[float, float, int]:
    """RSS of a process and all its descendants, the sum of their peaks, and how many."""
    import psutil

    total, peak, n = 0.0, 0.0, 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0.0, 0
    for p in procs:
        try:
            total += p.memory_info().rss
            peak += _hwm(p.pid)
            n += 1
        except psutil.Error:
            pass
    return total, peak, n


def _stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group this driver started, then SIGKILL whatever is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers (e.g. forked children) of this group
    proc.wait()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class Runner:
    """Runs scenarios against one Redis URL, each in a fresh work directory under ``root``."""

    def __init__(
        self,
        redis_url: str,
        root: Path,
        *,
        timeout: float = 900.0,
        nats_url: str | None = None,
        cluster_url: str | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.root = root
        self.timeout = timeout
        #: ``redis+cluster://…``: where the ``cluster`` rows run (skipped without it)
        self.cluster_url = cluster_url
        self.nats_url = nats_url

    def flush_nats(self) -> None:
        """Delete every stream of the NATS server (queues, buckets, the raw loop's)."""
        import asyncio

        import nats

        url = self.nats_url
        assert url is not None

        async def clear() -> None:
            nc = await nats.connect(url)
            js = nc.jetstream()
            for info in await js.streams_info():
                await js.delete_stream(str(info.config.name))
            await nc.close()

        asyncio.run(clear())

    def flush(self) -> None:
        from redis.cluster import RedisCluster

        import redis

        client = redis.Redis.from_url(self.redis_url)
        client.flushdb()
        client.close()
        if self.cluster_url:
            parts = urlsplit(self.cluster_url)
            plain = parts._replace(scheme=parts.scheme.split("+")[0], query="").geturl()
            cluster = RedisCluster.from_url(plain)
            cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
            cluster.close()

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
        missing = scenario.missing()
        if scenario.store == "nats" and not self.nats_url:
            missing = "needs a NATS server: --broker-url nats://host:port"
        if scenario.store == "cluster" and not self.cluster_url:
            missing = f"needs {scenario.install}"
        if missing:
            row.skipped = missing
            return row
        workdir = self.root / scenario.name
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "probe").mkdir(parents=True)
        if scenario.store == "cluster":
            broker_url = f"{self.cluster_url}{scenario.url_query}"
        elif scenario.store == "redis":
            broker_url = f"{self.redis_url}{scenario.url_query}"
        elif scenario.store == "nats" and self.nats_url:
            broker_url = self.nats_url
        else:
            broker_url = f"sqlite:///{workdir / 'bench.db'}"
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
        self.flush()
        if scenario.store == "nats":
            self.flush_nats()
        if not self._publish(scenario, row, workdir, env, values):
            return row
        self._consume(scenario, row, workdir, env, values)
        if scenario.leftover is not None:
            try:
                row.leftover = scenario.leftover(broker_url)
            except Exception as err:  # a report, not a verdict: say why it is unknown
                row.notes.append(f"could not read what is left in the queue: {err}")
        if row.consumed != count:
            row.notes.append(f"ran {row.consumed:,} of {count:,} tasks")
        return row

    # -- publishing ------------------------------------------------------------------------

    def _publish(
        self,
        scenario: Scenario,
        row: Row,
        workdir: Path,
        env: dict[str, str],
        values: Mapping[str, str],
    ) -> bool:
        log = workdir / "publish.log"
        bar = Progress(f"{scenario.name} publish", row.count)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                _fill(scenario.publisher, values),
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + self.timeout
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL)
                bar.update(self._progress(workdir))
            if proc.poll() is None:
                row.notes.append(f"publishing took longer than {self.timeout:.0f}s: stopped")
            _stop(proc)
        result_file = workdir / "publish.json"
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError):
            bar.finish(self._progress(workdir))
            row.skipped = f"the publisher failed (exit {proc.returncode}): {_tail(log)}"
            return False
        row.published, row.publish_s = int(result["count"]), float(result["seconds"])
        bar.finish(row.published)
        return True

    @staticmethod
    def _progress(workdir: Path) -> int:
        try:
            return int((workdir / "publish.progress").read_text() or 0)
        except (OSError, ValueError):
            return 0

    # -- consuming -------------------------------------------------------------------------

    def _consume(
        self,
        scenario: Scenario,
        row: Row,
        workdir: Path,
        env: dict[str, str],
        values: Mapping[str, str],
    ) -> None:
        try:
            import psutil
        except ImportError:
            psutil = None
            row.notes.append(f"psutil is missing, so no RSS: {scenario.install}")
        log = workdir / "worker.log"
        probes = workdir / "probe"
        count = row.count
        bar = Progress(f"{scenario.name} consume", count)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                _fill(scenario.worker, values),
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
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
                    self._sample_rss(row, ps, seen["count"], step)
                if seen["count"] != last_count:
                    last_count, last_change = seen["count"], now
                if seen["count"] >= count:
                    if ps is not None:
                        self._sample_rss(row, ps, seen["count"], step)
                    break
                if proc.poll() is not None:
                    row.notes.append(f"the worker exited early ({proc.returncode}): {_tail(log)}")
                    break
                if now - started > self.timeout:
                    row.notes.append(f"stopped after {self.timeout:.0f}s")
                    break
                idle = now - last_change
                if (last_count and idle > STALL_TIMEOUT) or (
                    not last_count and idle > STARTUP_TIMEOUT
                ):
                    row.notes.append(f"no progress for {idle:.0f}s: stopped; {_tail(log, 2)}")
                    break
            _stop(proc)
        seen = probe.read(probes)  # the final files, written at exit
        bar.finish(seen["count"])
        row.consumed = seen["count"]
        row.worker_processes = seen["processes"]
        if seen["count"]:
            row.consume_s = seen["last"] - seen["first"]

    @staticmethod
    def _sample_rss(row: Row, ps: Any, done: int, step: int) -> None:
        rss, hwm, n = _tree_rss(ps)
        if not n:
            return
        mb = rss / MB
        row.rss_peak_mb = max(row.rss_peak_mb or 0.0, mb, hwm / MB)
        if done:
            if row.rss_start_mb is None:
                row.rss_start_mb = mb
            row.rss_end_mb = mb
            if not row.rss_series or done - row.rss_series[-1][0] >= step:
                row.rss_series.append((done, round(mb, 1)))
