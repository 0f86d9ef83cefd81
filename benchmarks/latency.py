"""Latency of one ``send()`` on an idle worker, next to one Redis round trip.

A solo worker waits on an empty queue (blocked server-side, not polling); the script sends one
task at a time and measures from just before ``send()`` to the moment the task body runs, in the
worker's own process (the task writes the time it ran into a pipe). Budget (DESIGN.md): within 3x
of one Redis round trip (a ``PING``), measured in the same run. Starts its own redis-server.

    python benchmarks/latency.py [N]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import redis
from hurtle.bench.harness.servers import RedisServer

TASKS = textwrap.dedent(
    """
    import os, time
    from hurtle import Hurtle

    app = Hurtle()
    OUT = int(os.environ["LATENCY_FD"])

    @app.task(name="latency.ping", retries=0)
    def ping(sent):
        os.write(OUT, f"{sent} {time.perf_counter()}\\n".encode())
    """
)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    tmp = Path(tempfile.mkdtemp(prefix="hurtle-latency-"))
    server = RedisServer()
    url = server.url
    client = redis.Redis.from_url(url)
    (tmp / "latency_tasks.py").write_text(TASKS)
    read_fd, write_fd = os.pipe()
    env = dict(
        os.environ,
        HURTLE_BROKER_URL=url,
        LATENCY_FD=str(write_fd),
        PYTHONPATH=f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "hurtle", "--log-level", "WARNING", "worker", "latency_tasks:app"],
        env=env,
        pass_fds=(write_fd,),
        cwd=tmp,
    )
    os.close(write_fd)
    sys.path.insert(0, str(tmp))
    os.environ["HURTLE_BROKER_URL"] = url
    os.environ["LATENCY_FD"] = "-1"
    from latency_tasks import ping

    reader = os.fdopen(read_fd)
    ping.send(0.0)  # wait until the worker runs tasks
    reader.readline()
    pings, sends = [], []
    try:
        for _ in range(n):
            time.sleep(0.01)  # let the worker go back to waiting on an empty queue
            t = time.perf_counter()
            client.ping()
            pings.append(time.perf_counter() - t)
            t = time.perf_counter()
            ping.send(t)
            sent, ran = map(float, reader.readline().split())
            sends.append(ran - sent)
    finally:
        worker.terminate()
        worker.wait(30)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    p, s = statistics.median(pings) * 1e3, statistics.median(sends) * 1e3
    s99 = sorted(sends)[int(0.99 * (len(sends) - 1))] * 1e3
    print(f"redis PING round trip        median {p:.3f} ms")
    print(
        f"send() -> task runs (idle)   median {s:.3f} ms, p99 {s99:.3f} ms  ({s / p:.1f}x a PING)"
    )


if __name__ == "__main__":
    main()
