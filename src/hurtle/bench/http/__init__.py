"""``hurtle bench http``: the dashboard's enqueue endpoint under ``wrk`` with 500 connections,
against a plain ASGI app doing Redis ``INCR`` + ``GET`` under the same server, in one run.

Both apps (``http/apps.py``) run in one uvicorn process each (one event loop; uvloop and
httptools when installed, as uvicorn picks them), one after the other, on one throwaway
``redis-server``; ``wrk`` (the Debian package) drives each for ``--duration`` seconds after a
short warm-up. Per row: requests/s, p50 and p99 latency, non-2xx answers and socket errors
(connect, read, write, timeout), and for the enqueue row the messages the queue holds after the
run (at least the 2xx answers wrk counted: a request still open when wrk stops may have been
enqueued without being counted). Printed as a table; ``--json`` and ``--plot`` write them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ...cli._confirm import EXIT_NOT_CONFIRMED, add_yes, confirm_flush
from ...errors import ConfigurationError
from ..harness import options
from ..harness.servers import free_port

ROWS = ("hurtle-enqueue", "redis-incr")
QUEUE = "bench"
BODY = '{"task": "add", "args": [5, 6], "kwargs": {}}'
LUA = f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""


@dataclasses.dataclass
class HttpRow:
    name: str
    connections: int
    seconds: int
    requests: int = 0
    requests_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    non_2xx: int = 0
    socket_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    enqueued: int | None = None

    @property
    def errors(self) -> int:
        return self.non_2xx + sum(self.socket_errors.values())


HELP = "wrk -c 500 against the enqueue endpoint and a plain Redis INCR app"


def describe() -> str | None:
    """What ``hurtle bench http --help`` says above its options."""
    return __doc__


def add_options(http: argparse.ArgumentParser) -> None:
    http.add_argument(
        "--connections", "-c", type=int, default=500, help="wrk connections (default 500)"
    )
    http.add_argument("--threads", "-t", type=int, default=2, help="wrk threads (default 2)")
    http.add_argument(
        "--duration", type=int, default=10, help="measured seconds per row (default 10)"
    )
    http.add_argument("--only", default="", help=f"comma-separated rows of {', '.join(ROWS)}")
    options.add_redis_url(
        http, help="use this Redis instead of starting one (its database is FLUSHED)"
    )
    options.add_outputs(http)
    add_yes(http, "flush --redis-url")


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(output: str) -> dict[str, Any]:
    """What a ``wrk --latency`` run printed: requests, rate, p50/p99, non-2xx, socket errors."""
    out: dict[str, Any] = {"socket_errors": {}, "non_2xx": 0}
    if m := re.search(r"(\d+) requests in", output):
        out["requests"] = int(m.group(1))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", output):
        out["requests_per_s"] = float(m.group(1))
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        if m := re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", output, re.M):
            out[key] = _ms(m.group(1))
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", output):
        out["non_2xx"] = int(m.group(1))
    if m := re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    ):
        out["socket_errors"] = dict(
            zip(("connect", "read", "write", "timeout"), map(int, m.groups()), strict=True)
        )
    return out


def _serve(app: str, redis_url: str, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hurtle.bench.http.apps", app, redis_url, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigurationError(
                f"the {app} app exited: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise ConfigurationError(f"the {app} app did not listen on port {port}")


def _wrk(url: str, args: argparse.Namespace, seconds: int, script: Path | None) -> str:
    cmd = [
        "wrk",
        "-t",
        str(args.threads),
        "-c",
        str(args.connections),
        "-d",
        f"{seconds}s",
        "--latency",
        "--timeout",
        "10s",
    ]
    if script is not None:
        cmd += ["-s", str(script)]
    done = subprocess.run(
        [*cmd, url], capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    if done.returncode != 0:
        raise ConfigurationError(f"wrk failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def run_row(name: str, redis_url: str, args: argparse.Namespace, script: Path) -> HttpRow:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    port = free_port()
    app = "enqueue" if name == "hurtle-enqueue" else "incr"
    path = f"/api/queues/{QUEUE}/messages" if app == "enqueue" else "/"
    proc = _serve(app, redis_url, port)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        lua = script if app == "enqueue" else None
        _wrk(url, args, 2, lua)  # warm-up: connections, caches, pools
        client.flushdb()
        parsed = parse_wrk(_wrk(url, args, args.duration, lua))
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    row = HttpRow(name=name, connections=args.connections, seconds=args.duration, **parsed)
    if app == "enqueue":
        from ...brokers.redis import RedisBroker

        with RedisBroker(redis_url) as broker:
            row.enqueued = broker.stats([QUEUE])[QUEUE].ready
    client.close()
    return row


def table(rows: list[HttpRow]) -> str:
    head = (
        f"{'row':<16} {'conns':>5} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'non-2xx':>8} {'sock err':>8} {'enqueued':>9}"
    )
    lines = [head]
    for r in rows:

        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        lines.append(
            f"{r.name:<16} {r.connections:>5} {r.requests_per_s:>10,.0f} {num(r.p50_ms):>8} "
            f"{num(r.p99_ms):>8} {r.non_2xx:>8} {sum(r.socket_errors.values()):>8} "
            f"{'-' if r.enqueued is None else f'{r.enqueued:,}':>9}"
        )
    return "\n".join(lines)


def _plot(path: Path, rows: list[HttpRow]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r.name for r in rows], [r.requests_per_s for r in rows], color="#2c7be5")
    ax.set_xlabel(f"requests/s, wrk -c {rows[0].connections}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    import redis  # noqa: F401 - both rows need it: fail before starting anything

    from ..harness import machine
    from ..harness.servers import RedisServer

    if shutil.which("wrk") is None:
        raise ConfigurationError("wrk is not on PATH: apt-get install wrk")
    wanted = [n.strip() for n in args.only.split(",") if n.strip()] or list(ROWS)
    unknown = [n for n in wanted if n not in ROWS]
    if unknown:
        raise ConfigurationError(
            f"unknown row(s) {', '.join(unknown)}: choose from {', '.join(ROWS)}"
        )
    if not confirm_flush([args.redis_url], yes=args.yes):
        return EXIT_NOT_CONFIRMED
    server = None if args.redis_url else RedisServer()
    url = args.redis_url or (server.url if server else "")
    rows: list[HttpRow] = []
    try:
        info = machine.describe(url)
        with tempfile.TemporaryDirectory(prefix="hurtle-bench-http-") as tmp:
            script = Path(tmp) / "post.lua"
            script.write_text(LUA)
            for name in wanted:
                print(f"-- {name}", file=sys.stderr, flush=True)
                rows.append(run_row(name, url, args, script))
    finally:
        if server is not None:
            server.stop()
    print(table(rows))
    by = {r.name: r for r in rows}
    if "hurtle-enqueue" in by and "redis-incr" in by and by["redis-incr"].requests_per_s:
        ratio = by["hurtle-enqueue"].requests_per_s / by["redis-incr"].requests_per_s
        print(f"hurtle-enqueue / redis-incr: {ratio:.2f}x requests/s")
    if args.json:
        args.json.write_text(
            json.dumps({"machine": info, "rows": [dataclasses.asdict(r) for r in rows]}, indent=2)
        )
    if args.plot and rows:
        _plot(args.plot, rows)
    return 0
