"""What the partition tests share: the task module, the site (Redis, workers, publisher and
dashboard on hosts of their own), agents that act inside those hosts, and the trials' figures.

Every task has a number; it appends ``start <n> <pid>`` and ``done <n> <pid>`` to the project's
log (as the chaos tests' tasks do), and each tick of the periodic task run appends
``tick <tick> <message id> <pid>``: a tick enqueued twice shows as two message ids, a message run
twice as one id twice.

Settings (environment), as the chaos tests': ``HURTLE_CHAOS_TRIALS`` (trials per scenario,
default 2), ``HURTLE_CHAOS_SEED`` (the base seed, printed by each trial, to replay its random
choices) and ``HURTLE_CHAOS_REPORT`` (a file to which each trial's figures are appended as JSON
lines).
"""

from __future__ import annotations

import json
import os
import queue
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from netns import Host, Network

from helpers import hurtle_env

TRIALS = int(os.environ.get("HURTLE_CHAOS_TRIALS") or 2)
SEED = int(os.environ.get("HURTLE_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
REPORT = os.environ.get("HURTLE_CHAOS_REPORT")

#: Seconds of silence after which a worker's deliveries go to others.
HEARTBEAT_TIMEOUT = 2.0
#: Most messages one fetch may take.
BATCH = 20
#: Every wait of a trial ends by this deadline (seconds), whatever happens.
DEADLINE = 60.0
#: The port Redis and the dashboard listen on, each in its own host: no other run shares it.
REDIS_PORT = 6379
DASHBOARD_PORT = 8000

TASKS = textwrap.dedent(
    """
    import os
    import time

    from hurtle import Hurtle
    from hurtle.middleware import Middleware

    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line} {os.getpid()}\\n")


    class TickLog(Middleware):
        def before_process(self, job):
            message = job.message
            if "tick" in message.headers:
                record(f"tick {message.headers['tick']!r} {message.id}")


    app = Hurtle(middleware=[TickLog()])  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="partition.work", retries=0, store_result=True)
    def work(n, seconds):
        record(f"start {n}")
        time.sleep(seconds)
        record(f"done {n}")
        return os.getpid()


    if os.environ.get("TICKS"):

        @app.periodic(every=1.0)
        @app.task(name="partition.beat", retries=0)
        def beat():
            pass
    """
)


def trial_rng(scenario: str, trial: int) -> random.Random:
    """The random choices of one trial; prints the seed, which pytest shows on failure."""
    seed = f"{SEED}:{scenario}:{trial}"
    print(f"partition seed {seed!r}: replay with HURTLE_CHAOS_SEED={SEED}")
    return random.Random(seed)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``predicate`` until it holds; an ``AssertionError`` naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


class Agent:
    """A ``partition_agent.py`` process inside one host: ``call`` sends it a request."""

    def __init__(self, net: Network, host: Host, env: dict[str, str]) -> None:
        script = str(Path(__file__).with_name("partition_agent.py"))
        self.host = host
        self.proc = net.popen(
            host,
            [sys.executable, script],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._answers.put(line)

    def call(self, op: str, timeout: float = DEADLINE, **fields: Any) -> Any:
        """The agent's answer; ``RuntimeError`` if the request failed there."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        try:
            answer = json.loads(self._answers.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"the agent on {self.host.role} did not answer {op!r}") from None
        if "error" in answer:
            raise RuntimeError(f"{op} on {self.host.role}: {answer['error']}")
        return answer["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Site:
    """Hosts of one trial: ``redis`` (its server), ``w1`` and ``w2`` (workers; ``w1`` is the one
    cut off, with the dashboard) and ``pub`` (the publisher), each with an agent but ``redis``.
    ``close`` kills every process and removes the hosts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "tasks.py").write_text(TASKS)
        self.log = root / "runs.log"
        self.log.touch()
        self.sent_log = root / "sent.log"
        self.sent_log.touch()
        self.procs: list[subprocess.Popen[Any]] = []
        self.agents: dict[str, Agent] = {}
        self._outputs: dict[int, Path] = {}
        self.net = Network()
        try:
            self.hosts = {role: self.net.add(role) for role in ("redis", "w1", "w2", "pub")}
            redis = self.hosts["redis"]
            self.url = f"redis://{redis.address}:{REDIS_PORT}/0"
            self._start_redis(redis)
            for role in ("pub", "w1"):
                self.agents[role] = Agent(self.net, self.hosts[role], self.env())
            wait_until(self._redis_answers, "Redis to answer the publisher's host", 20)
        except BaseException:
            self.close()
            raise

    def _start_redis(self, host: Host) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None  # netns.unavailable() checked
        workdir = self.root / "redis"
        workdir.mkdir()
        args = [binary, "--bind", host.address, "--port", str(REDIS_PORT)]
        args += ["--protected-mode", "no", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(workdir), "--logfile", str(workdir / "redis.log")]
        self.procs.append(self.net.popen(host, args, stdout=subprocess.DEVNULL))

    def _redis_answers(self) -> bool:
        try:
            return bool(self.agents["pub"].call("ping", timeout=10))
        except RuntimeError:
            return False

    def env(self, **extra: str) -> dict[str, str]:
        return hurtle_env(
            HURTLE_BROKER_URL=self.url,
            RUNS_LOG=str(self.log),
            HURTLE_HEARTBEAT_TIMEOUT=f"{HEARTBEAT_TIMEOUT:g}",
            HURTLE_FETCH_BATCH_SIZE=str(BATCH),
            **extra,
        )

    def start(self, role: str, *args: str, **env: str) -> subprocess.Popen[str]:
        """``python -m hurtle ARGS`` on host ``role``; its output goes to a file."""
        out = self.root / f"{role}-{len(self.procs)}.log"
        with out.open("w") as f:
            proc = self.net.popen(
                self.hosts[role],
                [sys.executable, "-m", "hurtle", *args],
                cwd=self.root,
                env=self.env(**env),
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.procs.append(proc)
        self._outputs[proc.pid] = out
        return proc

    def output(self, proc: subprocess.Popen[str]) -> str:
        return self._outputs[proc.pid].read_text()

    def runs(self) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines()]

    def sent(self) -> dict[str, str]:
        """Number -> message id of each call whose publish returned."""
        return {
            p[1]: p[2]
            for line in self.sent_log.read_text().splitlines()
            if (p := line.split())[0] == "sent"
        }

    def unsure(self) -> set[str]:
        return {
            p[1]
            for line in self.sent_log.read_text().splitlines()
            if (p := line.split())[0] == "unsure"
        }

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.net.close()


@dataclass
class Trial:
    """The figures of one trial, as docs/reliability.md records them."""

    scenario: str
    cut: str
    seconds: float
    tasks: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: int = 0
    held_at_cut: int = 0
    duplicates_outside: list[str] = field(default_factory=list)
    ticks: int = 0
    ticks_twice: int = 0
    ticks_lost: list[float] = field(default_factory=list)
    overview_slowest: float = 0.0
    results_replaced: int = 0

    def save(self) -> None:
        RESULTS.append(self)
        if REPORT:
            with open(REPORT, "a") as f:
                f.write(json.dumps(asdict(self)) + "\n")


#: Every trial of this session, for the summary printed at its end (conftest.py).
RESULTS: list[Trial] = []
