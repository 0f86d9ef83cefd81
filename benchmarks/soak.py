"""A long soak: COUNT calls through one broker with two worker processes and a periodic task,
sampling memory as it goes (issue: "RSS flat, no growth in the broker's memory beyond what the
results' TTL keeps, 0 lost").

It starts a private server (``redis-server`` without persistence, or ``nats-server -js`` with
its store in a temporary directory), two ``hurtle worker`` processes of a small app whose task
stores its result for ``RESULT_TTL`` seconds, and whose periodic task runs every second. A
publisher sends ``send_many`` batches of 1,000 while the backlog is under ``BACKLOG`` (a steady
state, as a service that keeps up sees). Every few seconds it samples each worker's RSS, the
server's RSS (and Redis's ``used_memory``), the backlog and the calls done.

What is counted does not trust hurtle's own counters: each worker marks the argument of every
call it runs in a bitmap of its own (COUNT bits, allocated once) and writes it when it stops;
the soak ORs them, and reports the calls never run (lost) and those run twice. The periodic
task appends its run's tick to a file: ticks run twice are counted from it.

    python benchmarks/soak.py redis 10000000 --json docs/soak-redis.json --plot docs/soak-redis.png
    python benchmarks/soak.py nats 10000000 --json docs/soak-nats.json --plot docs/soak-nats.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

RESULT_TTL = 60
BACKLOG = 200_000
BATCH = 1_000

APP = textwrap.dedent(
    '''
    """The soak's app: a task that marks its argument in this process's bitmap, a tick."""
    import atexit
    import os
    import time

    from hurtle import Hurtle, current

    app = Hurtle(os.environ["SOAK_URL"], result_ttl=float(os.environ["SOAK_RESULT_TTL"]))
    _seen = None
    _twice = None

    def _dump():
        out = os.path.join(os.environ["SOAK_DIR"], f"seen-{os.getpid()}")
        with open(out + ".tmp", "wb") as f:
            f.write(bytes(_seen))
            f.write(bytes(_twice))
        os.replace(out + ".tmp", out)

    def _trace():
        """With SOAK_TRACEMALLOC=1 (workers only): Python's traced heap every 15 s, a snapshot
        at 120 s and one at exit, for the soak to compare."""
        import threading
        import tracemalloc

        tracemalloc.start(6)
        base = os.path.join(os.environ["SOAK_DIR"], f"trace-{os.getpid()}")
        started = time.time()

        def sample():
            first = True
            while True:
                time.sleep(15)
                with open(base + ".tsv", "a") as f:
                    heap = tracemalloc.get_traced_memory()[0]
                    f.write(f"{time.time() - started:.0f}\\t{heap}\\n")
                if first and time.time() - started >= 120:
                    tracemalloc.take_snapshot().dump(base + ".early")
                    first = False

        threading.Thread(target=sample, daemon=True).start()
        atexit.register(lambda: tracemalloc.take_snapshot().dump(base + ".late"))

    if os.environ.get("SOAK_TRACEMALLOC") == "1":
        _trace()

    @app.task(name="soak.add", store_result=os.environ["SOAK_RESULTS"] == "1")
    def add(i, y):
        global _seen, _twice
        if _seen is None:
            size = (int(os.environ["SOAK_COUNT"]) + 7) // 8
            _seen, _twice = bytearray(size), bytearray(size)
            atexit.register(_dump)
        byte, bit = i >> 3, 1 << (i & 7)
        if _seen[byte] & bit:
            _twice[byte] |= bit
        _seen[byte] |= bit
        return i + y

    @app.periodic(every=1.0)
    @app.task(name="soak.tick")
    def tick():
        with open(os.path.join(os.environ["SOAK_DIR"], "ticks"), "a") as f:
            f.write(f"{current().id} {time.time():.3f}\\n")
    '''
)


class Server:
    """A private redis-server or nats-server for the soak."""

    def __init__(self, kind: str, workdir: Path) -> None:
        from helpers import free_port

        self.kind = kind
        self.port = free_port()
        if kind == "redis":
            args = [
                "redis-server",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ]
            self.url = f"redis://127.0.0.1:{self.port}/0"
        else:
            nats = shutil.which("nats-server") or "/usr/sbin/nats-server"
            args = [nats, "-js", "-p", str(self.port), "-sd", str(workdir / "js")]
            self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir
        )
        time.sleep(0.5)

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def used_memory(self) -> int | None:
        if self.kind != "redis":
            return None
        import redis

        client = redis.Redis(port=self.port)
        try:
            return int(client.info("memory")["used_memory"])
        finally:
            client.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _tree_rss(pid: int) -> int:
    try:
        p = psutil.Process(pid)
        return int(p.memory_info().rss) + sum(
            int(c.memory_info().rss) for c in p.children(recursive=True)
        )
    except psutil.NoSuchProcess:
        return 0


def soak(
    kind: str, count: int, interval: float, results: bool = True, trace: bool = False
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"hurtle-soak-{kind}-"))
    server = Server(kind, workdir)
    (workdir / "soak_app.py").write_text(APP)
    env = {
        **os.environ,
        "SOAK_URL": server.url,
        "SOAK_DIR": str(workdir),
        "SOAK_COUNT": str(count),
        "SOAK_RESULT_TTL": str(RESULT_TTL),
        "SOAK_RESULTS": "1" if results else "0",
        "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "SOAK_TRACEMALLOC": "1" if trace else "0",
    }
    os.environ.update({k: env[k] for k in ("SOAK_URL", "SOAK_DIR", "SOAK_COUNT")})
    os.environ["SOAK_RESULT_TTL"] = str(RESULT_TTL)
    os.environ["SOAK_RESULTS"] = env["SOAK_RESULTS"]
    sys.path.insert(0, str(workdir))
    import soak_app  # type: ignore[import-not-found]  # written just above

    app = soak_app.app
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "hurtle", "worker", "soak_app:app", "--log-level", "WARNING"],
            env=env,
            cwd=workdir,
        )
        for _ in range(2)
    ]
    samples: list[dict[str, Any]] = []
    sent = 0
    stalled = 0.0
    finished: float | None = None
    started = time.time()
    next_sample = started
    queue = soak_app.add.queue

    def done() -> int:
        return sum(t.processed for t in app.broker.totals() if t.task == "soak.add")

    try:
        while True:
            now = time.time()
            stats = app.broker.stats([queue])[queue]
            backlog = stats.ready + stats.delayed
            if now >= next_sample:
                sample = {
                    "t": round(now - started, 1),
                    "sent": sent,
                    "done": done(),
                    "backlog": backlog,
                    "workers_rss": [_tree_rss(w.pid) for w in workers],
                    "server_rss": server.rss(),
                    "used_memory": server.used_memory(),
                }
                samples.append(sample)
                print(json.dumps(sample), flush=True)
                next_sample = now + interval
                if sample["done"] >= count and backlog == 0 and finished is None:
                    # the results of the last minute expire now: memory is sampled until
                    # they have, with the workers and their periodic task still running
                    finished = now
                if finished is not None and now - finished > (RESULT_TTL if results else 0) + 30:
                    break
                if sent >= count and backlog == 0 and finished is None:
                    # everything fetched: the counters settle within a few heartbeats, or
                    # what is missing never comes (the bitmaps below say what)
                    if len(samples) > 1 and samples[-2]["done"] == sample["done"]:
                        stalled += interval
                        if stalled > 60:
                            break
                    else:
                        stalled = 0.0
            if sent < count and backlog < BACKLOG:
                n = min(BATCH * 10, count - sent)
                for start in range(sent, sent + n, BATCH):
                    soak_app.add.send_many(
                        [(i, 1) for i in range(start, min(start + BATCH, sent + n))]
                    )
                sent += n
            else:
                time.sleep(0.2)
        elapsed = (finished or time.time()) - started
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(120)
    seen = bytearray((count + 7) // 8)
    twice = 0
    dumps = sorted(workdir.glob("seen-*"))
    for path in dumps:
        raw = path.read_bytes()
        half = len(raw) // 2
        mine, again = raw[:half], raw[half:]
        twice += sum(bin(b).count("1") for b in again)
        for j, b in enumerate(mine):
            if seen[j] & b:
                twice += bin(seen[j] & b).count("1")
            seen[j] |= b
    ran = sum(bin(b).count("1") for b in seen)
    ticks = (workdir / "ticks").read_text().split("\n") if (workdir / "ticks").exists() else []
    tick_ids = [line.split()[0] for line in ticks if line]
    dead = len(app.broker.dead_letters(queue, limit=1000))
    traced = _traced(workdir) if trace else None
    app.close()
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "broker": kind,
        "count": count,
        "seconds": round(elapsed, 1),
        "ran": ran,
        "lost": count - ran,
        "ran_twice": twice,
        "dead_letters": dead,
        "worker_dumps": len(dumps),
        "ticks_run": len(tick_ids),
        "ticks_twice": len(tick_ids) - len(set(tick_ids)),
        "result_ttl": RESULT_TTL if results else None,
        "workers_rss_mib": _span(samples, lambda s: max(s["workers_rss"])),
        "server_rss_mib": _span(samples, lambda s: s["server_rss"]),
        "used_memory_mib": _span(samples, lambda s: s["used_memory"] or 0),
        "samples": samples,
        **({"traced": traced} if traced is not None else {}),
    }


def _traced(workdir: Path) -> dict[str, Any]:
    """Per worker: its traced Python heap over time (MiB) and the 10 places whose allocations
    grew most between the snapshot at 120 s and the one at exit."""
    import tracemalloc

    out: dict[str, Any] = {}
    for tsv in sorted(workdir.glob("trace-*.tsv")):
        pid = tsv.stem.split("-")[1]
        series = [line.split("\t") for line in tsv.read_text().splitlines() if line]
        worker: dict[str, Any] = {
            "heap_mib": [[int(t), round(int(b) / 2**20, 2)] for t, b in series],
        }
        early, late = workdir / f"trace-{pid}.early", workdir / f"trace-{pid}.late"
        if early.exists() and late.exists():
            diff = tracemalloc.Snapshot.load(str(late)).compare_to(
                tracemalloc.Snapshot.load(str(early)), "lineno"
            )
            worker["grew_most"] = [
                f"{d.size_diff / 1024:+.1f} KiB {d.count_diff:+d} objects at {d.traceback[0]}"
                for d in diff[:10]
            ]
        out[pid] = worker
    return out


def _span(samples: list[dict[str, Any]], read: Any) -> dict[str, float]:
    """A memory figure after the first 10% of the run, its peak, and at the end (MiB)."""
    steady = samples[len(samples) // 10]
    return {
        "after_10pct": round(read(steady) / 2**20, 1),
        "peak": round(max(read(s) for s in samples) / 2**20, 1),
        "last": round(read(samples[-1]) / 2**20, 1),
    }


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    t = [s["t"] for s in samples]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    middle_label = "server RSS"
    for k in range(len(samples[0]["workers_rss"])):
        top.plot(t, [s["workers_rss"][k] / 2**20 for s in samples], label=f"worker {k + 1}")
    top.set_ylabel("worker RSS (MiB)")
    top.set_ylim(bottom=0)
    top.legend(loc="lower right")
    middle.plot(t, [s["server_rss"] / 2**20 for s in samples], label=middle_label)
    if samples[0]["used_memory"] is not None:
        middle.plot(t, [s["used_memory"] / 2**20 for s in samples], label="Redis used_memory")
    middle.set_ylabel("server (MiB)")
    middle.set_ylim(bottom=0)
    middle.legend(loc="upper left")
    bottom.plot(t, [s["done"] / 1e6 for s in samples], label="calls done")
    bottom.set_ylabel("calls done (millions)")
    bottom.set_xlabel("seconds")
    for ax in (top, middle, bottom):
        ax.axvline(report["seconds"], color="grey", linestyle=":")
    fig.suptitle(
        f"hurtle soak on {report['broker']}: {report['count']:,} calls, 2 workers, "
        + (f"results kept {report['result_ttl']} s" if report["result_ttl"] else "no results")
        + f"; lost {report['lost']}, run twice {report['ran_twice']}"
        "\n(dotted: the last call done; sampled on until its results expired)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("broker", choices=["redis", "nats"])
    parser.add_argument("count", type=int)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--no-results", action="store_true", help="the task keeps no result (default: 60 s)"
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the workers' Python heap (slower): its size over time and where it grew",
    )
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args()
    report = soak(
        args.broker, args.count, args.interval, results=not args.no_results, trace=args.tracemalloc
    )
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report) + "\n")
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
