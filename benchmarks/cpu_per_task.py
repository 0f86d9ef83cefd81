"""CPU time per task of the raw ``LPOP key 1000`` loop and of a solo worker, client and server.

Wall-clock rates on a shared 2-core machine follow its load; CPU time does not (much). This starts a
private ``redis-server``, then for ROUNDS rounds: publishes N ``bench.add`` calls the raw way and
consumes them with the raw loop of ``hurtle bench tasks`` (``raw-batch``), then publishes N with
``send_many`` and consumes them with a solo burst worker in this process. For each it prints the
client's CPU µs per task (this process: every thread) and the server's (``INFO cpu``), and per
thread of the worker (the batch loop's, the acknowledger's, the rest).

    python benchmarks/cpu_per_task.py [N] [ROUNDS]

On two cores with nothing else running the worker and the server overlap, and the ratio of rates
is about raw client / hurtle client; on a loaded machine every instruction counts wherever it runs,
and the ratio falls towards raw (client + server) / hurtle (client + server).
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from typing import Any

import redis
from hurtle.bench.harness.servers import RedisServer


def _server_cpu(r: redis.Redis) -> float:
    info: dict[str, Any] = r.info("cpu")  # type: ignore[assignment]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by name (Linux: /proc/self/task)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), f"thread-{tid}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def raw_round(url: str, count: int) -> tuple[float, float, float]:
    from hurtle.bench.peers import raw_redis

    r = redis.Redis.from_url(url)
    r.flushdb()
    os.environ["HURTLE_BENCH_REDIS_URL"] = url
    raw_redis.publish_kind("pipelined", count, lambda sent: None)
    server0, client0, wall0 = _server_cpu(r), time.process_time(), time.perf_counter()
    raw_redis.consume("batch", count)
    wall = time.perf_counter() - wall0
    return (time.process_time() - client0, _server_cpu(r) - server0, wall)


def hurtle_round(url: str, count: int) -> tuple[float, float, float, dict[str, float]]:
    from hurtle.bench.peers import hurtle_app

    r = redis.Redis.from_url(url)
    r.flushdb()
    hurtle_app.publish(count, lambda sent: None)
    worker = hurtle_app.app.worker(pool="solo", burst=True)
    before = _threads_cpu()
    server0, client0, wall0 = _server_cpu(r), time.process_time(), time.perf_counter()
    threads: dict[str, float] = {}
    stop = threading.Event()

    def sample() -> None:  # the worker's threads end with it: read them while they live
        while not stop.wait(0.05):
            threads.update(_threads_cpu())

    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    sampler.start()
    worker.run()
    wall = time.perf_counter() - wall0
    client = time.process_time() - client0
    stop.set()
    sampler.join()
    threads.update(_threads_cpu())
    per_thread = {k: v - before.get(k, 0.0) for k, v in threads.items() if k != "sampler"}
    assert worker.processed == count, worker.processed
    return client, _server_cpu(r) - server0, wall, per_thread


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    server = RedisServer()
    os.environ["HURTLE_BROKER_URL"] = server.url
    os.environ["HURTLE_BENCH_REDIS_URL"] = server.url
    us = 1e6 / count
    raws: list[tuple[float, float]] = []
    ours: list[tuple[float, float]] = []
    try:
        for n in range(rounds):
            client, srv, wall = raw_round(server.url, count)
            raws.append((client * us, srv * us))
            print(
                f"round {n + 1} raw:    client {client * us:5.2f} µs  server {srv * us:5.2f} µs"
                f"  ({count / wall:,.0f}/s)"
            )
            client, srv, wall, threads = hurtle_round(server.url, count)
            ours.append((client * us, srv * us))
            parts = "  ".join(f"{k} {v * us:.2f}" for k, v in sorted(threads.items()) if v)
            print(
                f"round {n + 1} hurtle: client {client * us:5.2f} µs  server {srv * us:5.2f} µs"
                f"  ({count / wall:,.0f}/s)  threads: {parts}"
            )
    finally:
        server.stop()
    rc = statistics.median(c for c, _ in raws)
    rs = statistics.median(s for _, s in raws)
    hc = statistics.median(c for c, _ in ours)
    hs = statistics.median(s for _, s in ours)
    print(
        f"median µs/task: raw {rc:.2f} + {rs:.2f}, hurtle {hc:.2f} + {hs:.2f}; "
        f"client ratio {rc / hc:.2f}x, total ratio {(rc + rs) / (hc + hs):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
