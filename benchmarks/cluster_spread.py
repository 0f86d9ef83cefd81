"""Where the work of a Redis Cluster goes: the same load on one Redis and on three masters, and
what each server spent on it, per task.

    python benchmarks/cluster_spread.py -n 60000
    python benchmarks/cluster_spread.py -n 200000 --scenarios bare,results --replicas 1

Starts its own servers on free ports of 127.0.0.1 (no persistence): one ``redis-server``, and a
Redis Cluster of three masters (``--replicas`` replicas each) made by ``redis-cli --cluster
create``; picks three queue names whose slots fall on the three masters (``CLUSTER KEYSLOT``,
``CLUSTER SLOTS``). For each scenario and each of the two, it starts ``--workers`` solo workers
per queue (one by default), with the queues paused; once they wait, idle, it publishes N tasks
with ``send_many`` in batches of ``--batch``, in turn to the three queues, from this process;
then resumes the queues and waits until the workers have emptied them. Around each phase it
reads every server's ``INFO cpu`` (``used_cpu_sys`` + ``used_cpu_user``, less the server's idle
rate, measured first, times the phase's length) and ``INFO commandstats``, and prints them per
task. The workers' CPU comes from ``/proc/PID/task/*/schedstat`` (Linux), the publisher's from
``process_time``.

Then it runs the scenario again on the cluster, smaller (``--monitor-tasks``), with ``MONITOR``
on every master, and counts which keys each command named and which connection sent it: the
keys outside any queue (``hurtle:queues``, the workers' reports, the results channel, the
dead-letter index) each live on one master, and this shows what they cost per batch. (MONITOR
slows a server down: that pass is not timed.)

Scenarios (tasks that return their number):

* ``bare`` — no feature;
* ``results`` — ``store_result=True``: each ack also writes results, under keys of their own;
* ``unique`` — ``unique_for=600``: a lock per publish, released at the ack (in the queue's slot);
* ``dead`` — the task raises, ``retries=0``: every task is dead-lettered, which also writes the
  cluster-wide ``hurtle:dead:index``.

Redis counts a command a script runs under its own name too, and in the script's time: the
scripts' microseconds below include the commands they ran. CPU figures are of a loopback run on
the machine at hand: a network changes what each round trip costs, not how many there are.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cluster_keys import GLOBAL_KEYS, Seen, print_monitored

import redis
from hurtle import Hurtle
from hurtle.bench.harness.servers import RedisClusterServer, RedisServer
from hurtle.brokers.keys import queue_keys

TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL


    @app.task(name="spread.bare")
    def bare(n):
        return n


    @app.task(name="spread.results", store_result=True)
    def results(n):
        return n


    @app.task(name="spread.unique", unique_for=600)
    def unique(n):
        return n


    @app.task(name="spread.dead", retries=0)
    def dead(n):
        raise ValueError(n)
    """
)
SCENARIOS = ("bare", "results", "unique", "dead")
#: The client name of this script's own connections (pause, resume, stats, workers).
CONTROL = "cluster-spread-control"
#: Seconds between two looks at whether the workers have emptied the queues.
POLL = 0.05
#: Seconds to wait for a server, a cluster or a worker.
DEADLINE = 600.0


@dataclass
class Node:
    label: str
    port: int
    role: str  # "one Redis", "master", "replica"

    @property
    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)


class Servers:
    """One Redis and one cluster of three masters, started now; ``stop`` ends them."""

    def __init__(self, replicas: int) -> None:
        self.cluster_server = RedisClusterServer(3, replicas)
        try:
            self.single_server = RedisServer()
        except BaseException:
            self.cluster_server.stop()
            raise
        self.single = Node("one Redis", self.single_server.port, "one Redis")
        self.masters = [Node(f"master :{p}", p, "master") for p in self.cluster_server.masters]
        replicas_ = self.cluster_server.replicas
        self.cluster = self.masters + [Node(f"replica :{p}", p, "replica") for p in replicas_]
        self.cluster_url = self.cluster_server.url

    def master_of(self, key: str) -> Node:
        """The master serving ``key`` (``CLUSTER KEYSLOT``, ``CLUSTER SLOTS``)."""
        c = self.masters[0].client
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        for lo, hi, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if int(lo) <= slot <= int(hi):
                return next(n for n in self.masters if n.port == int(primary[1]))
        raise SystemExit(f"no master serves slot {slot}")

    def stop(self) -> None:
        self.single_server.stop()
        self.cluster_server.stop()


def pick_queues(servers: Servers) -> dict[str, Node]:
    """Three queue names whose keys live on three different masters."""
    chosen: dict[int, tuple[str, Node]] = {}
    for i in range(1000):
        name = f"spread-{i}"
        node = servers.master_of(queue_keys(name).wake)
        chosen.setdefault(node.port, (name, node))
        if len(chosen) == 3:
            return dict(sorted(chosen.values(), key=lambda c: c[1].port))
    raise SystemExit("no three queue names on three masters")


@dataclass
class Spent:
    """What one server spent: CPU seconds, and per command (calls, usec)."""

    cpu: float
    commands: dict[str, tuple[int, int]]
    at: float = 0.0

    @classmethod
    def reading(cls, node: Node) -> Spent:
        c = node.client
        cpu, stats = c.info("cpu"), c.info("commandstats")
        return cls(
            float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            {
                k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
                for k, v in stats.items()
            },
            time.monotonic(),
        )

    def minus(self, before: Spent, idle: float) -> Spent:
        commands = {}
        for name, (calls, usec) in self.commands.items():
            c0, u0 = before.commands.get(name, (0, 0))
            if calls > c0 and name.split("|")[0] not in ("info", "cluster", "flushall"):
                commands[name] = (calls - c0, usec - u0)
        return Spent(max(self.cpu - before.cpu - idle * (self.at - before.at), 0.0), commands)

    def __add__(self, other: Spent) -> Spent:
        commands = dict(self.commands)
        for name, (c, u) in other.commands.items():
            c0, u0 = commands.get(name, (0, 0))
            commands[name] = (c0 + c, u0 + u)
        return Spent(self.cpu + other.cpu, commands)

    @property
    def script_usec(self) -> int:
        return sum(u for name, (_, u) in self.commands.items() if name in ("evalsha", "eval"))


def idle_rates(nodes: list[Node], seconds: float = 3.0) -> dict[int, float]:
    """CPU seconds per second each server spends with no client: its cron, the cluster bus."""
    before = {n.port: Spent.reading(n) for n in nodes}
    time.sleep(seconds)
    after = {n.port: Spent.reading(n) for n in nodes}
    return {p: max((after[p].cpu - b.cpu) / (after[p].at - b.at), 0.0) for p, b in before.items()}


def load_tasks(workdir: Path, url: str) -> ModuleType:
    """A fresh copy of the tasks module, on ``url``."""
    os.environ["HURTLE_BROKER_URL"] = url
    spec = importlib.util.spec_from_file_location("spread_tasks", workdir / "spread_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_workers(
    workdir: Path, url: str, queues: list[str], each: int
) -> list[subprocess.Popen[bytes]]:
    """``each`` solo workers per queue, their output in ``workers.log``."""
    env = {**os.environ, "HURTLE_BROKER_URL": url, "PYTHONPATH": str(workdir)}
    with (workdir / "workers.log").open("ab") as out:
        return [
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "hurtle", "worker", "spread_tasks:app"),
                    *("--pool", "solo", "-Q", q, "--log-level", "ERROR"),
                ],
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            for q in queues
            for _ in range(each)
        ]


def cpu_seconds(pid: int) -> float:
    """The CPU time of every thread of process ``pid`` (``/proc/PID/task/*/schedstat``)."""
    ns = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError):
            ns += int(stat.read_text().split()[0])
    return ns / 1e9


def wait_for(condition: Callable[[], bool], what: str, every: float = 0.25) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(every)


@dataclass
class Run:
    """One scenario on one target: per server, what each phase spent; and the clients' CPU."""

    publish: dict[int, Spent]
    consume: dict[int, Spent]
    publisher_cpu: float
    worker_cpu: list[float]
    #: wall-clock seconds of each phase (the consume phase's to within ``POLL``)
    walls: tuple[float, float]
    #: (port, address) of this script's own connections
    controls: set[tuple[int, str]]


def run(scenario: str, url: str, nodes: list[Node], queues: list[str], n: int, args: Any) -> Run:
    """Publish ``n`` tasks of ``scenario`` to ``queues`` (paused), then let the workers, started
    before and idle, consume them; read ``nodes`` and the workers around each phase."""
    for node in nodes:
        if node.role != "replica":
            node.client.flushall()
    app = load_tasks(args.workdir, url).app
    bound = [app.tasks[f"spread.{scenario}"].options(queue=q) for q in queues]
    # this script's own reads and writes, on connections named so that MONITOR can tell them
    control = Hurtle(url + ("&" if "?" in url else "?") + f"client_name={CONTROL}")
    for q in queues:
        control.pause(q)
    workers = start_workers(args.workdir, url, queues, args.workers)
    try:
        wait_for(lambda: len(control.broker.workers()) == len(workers), "the workers to start")
        time.sleep(1.0)  # into their idle wait
        r0 = {nd.port: Spent.reading(nd) for nd in nodes}
        cpu0, t0 = time.process_time(), time.monotonic()
        for sent in range(0, n, args.batch):
            calls = [(i,) for i in range(sent, min(sent + args.batch, n))]
            bound[(sent // args.batch) % len(bound)].send_many(calls)
        publisher_cpu, t1 = time.process_time() - cpu0, time.monotonic()
        r1 = {nd.port: Spent.reading(nd) for nd in nodes}
        w1 = [cpu_seconds(w.pid) for w in workers]
        for q in queues:
            control.resume(q)

        def drained() -> bool:
            left = control.broker.stats(queues).values()
            return not any(s.ready or s.in_flight or s.delayed for s in left)

        wait_for(drained, "the workers to empty the queues", POLL)
        t2 = time.monotonic()
        r2 = {nd.port: Spent.reading(nd) for nd in nodes}
        w2 = [cpu_seconds(w.pid) for w in workers]
        controls = {
            (nd.port, c["addr"])
            for nd in nodes
            for c in nd.client.client_list()
            if c.get("name") == CONTROL
        }
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(60)
        app.close()
        control.close()
    idle = args.idle
    return Run(
        {p: r1[p].minus(r0[p], idle[p]) for p in r0},
        {p: r2[p].minus(r1[p], idle[p]) for p in r0},
        publisher_cpu,
        [b - a for a, b in zip(w1, w2, strict=True)],
        (t1 - t0, t2 - t1),
        controls,
    )


def monitored(scenario: str, servers: Servers, queues: list[str], args: Any) -> dict[int, Seen]:
    """The scenario again on the cluster, with ``MONITOR`` on every master."""
    procs, files = {}, {}
    for m in servers.masters:
        files[m.port] = args.workdir / f"monitor-{m.port}.log"
        with files[m.port].open("wb") as out:
            procs[m.port] = subprocess.Popen(
                ["redis-cli", "-p", str(m.port), "monitor"], stdout=out
            )
    for m in servers.masters:  # it prints "OK" once it monitors
        while files[m.port].stat().st_size == 0:
            time.sleep(0.01)
    done = run(scenario, servers.cluster_url, servers.masters, queues, args.monitor_tasks, args)
    for proc in procs.values():
        proc.terminate()
        proc.wait()
    seen = {}
    for port, path in files.items():
        seen[port] = Seen()
        ours = {addr for p, addr in done.controls if p == port}
        with path.open("rb") as f:
            for line in f:
                seen[port].add(line, queues, ours)
    return seen


def _us(seconds: float, n: int) -> str:
    return f"{seconds * 1e6 / n:.2f}"


def print_spent(n: int, single: Node, servers: Servers, one: Run, many: Run) -> None:
    print(
        "| server | publish: CPU µs/task | consume: CPU µs/task | CPU µs/task | share of one "
        "Redis | scripts µs/task | commands/task | busiest commands (µs/task) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    base = one.publish[single.port].cpu + one.consume[single.port].cpu

    def row(label: str, pub: Spent, con: Spent) -> None:
        spent = pub + con
        top = sorted(spent.commands.items(), key=lambda kv: -kv[1][1])[:4]
        print(
            f"| {label} | {_us(pub.cpu, n)} | {_us(con.cpu, n)} | {_us(spent.cpu, n)} | "
            f"{spent.cpu / base:.2f} | {_us(spent.script_usec / 1e6, n)} | "
            f"{sum(c for c, _ in spent.commands.values()) / n:.2f} | "
            + ", ".join(f"{name} {_us(u / 1e6, n)}" for name, (_, u) in top)
            + " |"
        )

    row("one Redis", one.publish[single.port], one.consume[single.port])
    for node in servers.cluster:
        row(node.label, many.publish[node.port], many.consume[node.port])
    first, *rest = servers.masters
    row(
        "three masters together",
        sum((many.publish[m.port] for m in rest), many.publish[first.port]),
        sum((many.consume[m.port] for m in rest), many.consume[first.port]),
    )
    print()
    for label, r in (("one Redis", one), ("cluster", many)):
        workers = ", ".join(_us(c, n // len(r.worker_cpu)) for c in r.worker_cpu)
        print(
            f"- {label}: publisher {_us(r.publisher_cpu, n)} CPU µs/task; workers "
            f"{workers} CPU µs per task they ran (if shared evenly); wall clock: published "
            f"{n / r.walls[0]:,.0f}/s, consumed {n / r.walls[1]:,.0f}/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--tasks", type=int, default=60000, help="tasks per scenario")
    parser.add_argument("--batch", type=int, default=1000, help="tasks per send_many")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    parser.add_argument("--replicas", type=int, default=0, help="replicas per master")
    parser.add_argument("--workers", type=int, default=1, help="solo workers per queue")
    parser.add_argument(
        "--monitor-tasks", type=int, default=9000, help="tasks of the MONITOR pass (0: none)"
    )
    args = parser.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    if (
        set(args.scenarios) - set(SCENARIOS)
        or args.tasks < 3
        or args.batch < 1
        or args.replicas < 0
        or args.workers < 1
        or args.monitor_tasks < 0
    ):
        parser.error(f"scenarios are {', '.join(SCENARIOS)}; -n >= 3, --batch >= 1")
    with _workdir() as args.workdir:
        (args.workdir / "spread_tasks.py").write_text(TASKS)
        servers = Servers(args.replicas)
        try:
            report(servers, args)
        finally:
            servers.stop()


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hurtle-cluster-spread-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def report(servers: Servers, args: Any) -> None:
    n, single = args.tasks, servers.single
    spread = pick_queues(servers)
    queues = list(spread)
    single_url = f"redis://127.0.0.1:{single.port}/0"
    cluster_url = servers.cluster_url
    print(
        f"# {n:,} tasks per scenario, send_many batches of {args.batch:,}, {args.workers} solo "
        f"worker(s) per queue; three masters, {args.replicas} replica(s) each"
    )
    version = single.client.info("server")["redis_version"]
    print(f"\nRedis {version}, Python {sys.version.split()[0]}, {os.cpu_count()} cores\n")
    for q, node in spread.items():
        slot = node.client.execute_command("CLUSTER", "KEYSLOT", queue_keys(q).wake)
        print(f"- queue {q}: slot {slot}, on {node.label}")
    for key, what in GLOBAL_KEYS.items():
        print(f"- {what} ({key}): on {servers.master_of(key).label}")
    nodes = [single, *servers.cluster]
    args.idle = idle_rates(nodes)
    print(
        "- idle CPU, ms/s (taken off the figures): "
        + ", ".join(f"{nd.label} {args.idle[nd.port] * 1e3:.2f}" for nd in nodes)
    )
    for scenario in args.scenarios:
        print(f"\n## {scenario}\n")
        one = run(scenario, single_url, [single], queues, n, args)
        many = run(scenario, cluster_url, servers.cluster, queues, n, args)
        print_spent(n, single, servers, one, many)
        if args.monitor_tasks:
            seen = monitored(scenario, servers, queues, args)
            print_monitored(args.monitor_tasks, servers.masters, seen, many, args.batch)


if __name__ == "__main__":
    main()
