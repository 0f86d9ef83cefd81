"""What the chaos tests share: the task module, seeded trials, the tally of runs, the fleet.

Every task of a trial has a number; the task appends ``start <n> <pid>`` and ``done <n> <pid>``
to the project's log, so the tally counts each task by its number: lost = sent (or published
and returned) but never done, duplicates = done more than once.

Settings (environment):

* ``HURTLE_CHAOS_TRIALS`` — trials per scenario and broker (default 2, the quick setting CI runs;
  ``100`` is the full run that docs/reliability.md records).
* ``HURTLE_CHAOS_SEED`` — the base seed (default: drawn at random). Each trial prints its seed;
  a failure shows it, and ``HURTLE_CHAOS_SEED=<base>`` replays the same random choices.
* ``HURTLE_CHAOS_REPORT`` — a file to which each trial's figures are appended as JSON lines.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from helpers import Project
from hurtle.errors import BrokerError

TRIALS = int(os.environ.get("HURTLE_CHAOS_TRIALS") or 2)
SEED = int(os.environ.get("HURTLE_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
REPORT = os.environ.get("HURTLE_CHAOS_REPORT")

#: Most messages one fetch may take (``HURTLE_FETCH_BATCH_SIZE``), kept small so that the
#: bound on duplicates below says something.
BATCH = 20
#: Concurrency of the threads pool in these tests.
THREADS = 4
#: What one worker can hold at the broker when it dies, so what may run twice after it:
#:
#: * solo: the batch it runs, the next batch already prefetched, and the outcomes of the
#:   previous batch that its acker (which flushes every 5 ms) may not have recorded yet:
#:   ``3 * BATCH``;
#: * threads: ``THREADS`` running, a window of at most one fetch batch buffered beyond them
#:   (README: the threads pool fetches about 50 ms of work ahead, capped at the fetch batch
#:   size), plus outcomes not yet recorded: up to two fetch batches, since the threads
#:   acknowledge their shares while the acker's previous write may still wait on a busy SQLite
#:   file: ``THREADS + 3 * BATCH``.
HOLD = {"solo": 3 * BATCH, "threads": THREADS + 3 * BATCH}

#: Seconds of silence after which a worker's deliveries go to others: small, so that the
#: recovery a trial waits for comes quickly.
ENV = {
    "HURTLE_HEARTBEAT_TIMEOUT": "1",
    "HURTLE_FETCH_BATCH_SIZE": str(BATCH),
    "HURTLE_SHUTDOWN_TIMEOUT": "10",
}
#: Every wait of a trial ends by this deadline (seconds), whatever happens.
DEADLINE = 30.0

TASKS = textwrap.dedent(
    """
    import os
    import time

    from hurtle import Hurtle, Reject

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line} {os.getpid()}\\n")


    @app.task(name="chaos.work", retries=0)
    def work(n, seconds):
        record(f"start {n}")
        if seconds:
            time.sleep(seconds)
        record(f"done {n}")


    @app.task(name="chaos.poison", retries=1, retry_delay=0.01)
    def poison(n):
        record(f"start {n}")
        os._exit(1)


    # what ends with a dead letter (test_poison.py, test_chaos_dead_ends.py): each task, with
    # how its call goes ("ok", "fail", "crash", "reject"), as the test side sends it
    def go(n, how, seconds=0.0):
        record(f"start {n}")
        if seconds:
            time.sleep(seconds)
        if how == "fail":
            raise ValueError(f"failed {n}")
        if how == "reject":
            raise Reject(f"rejected {n}")
        if how == "crash":
            os._exit(1)
        record(f"done {n}")
        return n


    kept = app.task(name="chaos.kept", store_result=True, retries=0)(go)
    once = app.task(name="chaos.once", unique_for=600, retries=0)(go)
    stale = app.task(name="chaos.stale", store_result=True, retries=0, expires=0.001)(go)


    # sent as ``go`` is called (test side: ``register``), it takes one argument here: each call
    # is a dead letter of arguments that do not fit the task
    @app.task(name="chaos.narrow", unique_for=600, retries=0)
    def narrow(n):
        record(f"start {n}")


    @app.task(name="chaos.total", retries=0)
    def total(xs):
        return sum(xs)
    """
)
TASK_NAMES = ("chaos.work", "chaos.poison")
#: The test side of the tasks above (``register``): options that act when a call is sent.
DEAD_END_TASKS = {
    "chaos.kept": {"store_result": True},
    "chaos.once": {"unique_for": 600},
    "chaos.stale": {"store_result": True, "expires": 0.001},
    "chaos.narrow": {"unique_for": 600},
    "chaos.total": {},
}


def register(project: Project) -> dict[str, Any]:
    """The project's app's tasks of ``DEAD_END_TASKS``, to send (and wait on) from the test."""

    def go(n: object, how: str, seconds: float = 0.0) -> object:
        return n

    def total(xs: list[int]) -> int:
        return sum(xs)

    app = project.app
    return {
        name: app.tasks.get(name)
        or app.task(name=name, retries=0, **options)(total if name == "chaos.total" else go)
        for name, options in DEAD_END_TASKS.items()
    }


def trial_rng(scenario: str, trial: int) -> random.Random:
    """The random choices of one trial; prints the seed, which pytest shows on failure."""
    seed = f"{SEED}:{scenario}:{trial}"
    print(f"chaos seed {seed!r}: replay with HURTLE_CHAOS_SEED={SEED}")
    return random.Random(seed)


def done_count(project: Project) -> int:
    return sum(1 for line in project.runs() if line.startswith("done "))


@dataclass
class Tally:
    """What ran, counted by task number, against what had to run."""

    broker: str
    scenario: str
    expected: int
    lost: list[str] = field(default_factory=list)
    duplicates: int = 0
    max_duplicates: int = 0
    unexpected: list[str] = field(default_factory=list)
    #: Handles still waiting at the trial's end (what waits on a dead letter must end).
    pending: list[str] = field(default_factory=list)
    #: Innocent calls the broker took for killers: dead-lettered because their workers died
    #: more than max_recoveries times while they held them, the last time with a killer that
    #: had not been quarantined yet (they end, as ``WorkerLost``).
    blamed: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        project: Project,
        broker: str,
        scenario: str,
        expected: set[str],
        allowed: set[str] | None = None,
    ) -> Tally:
        """``expected`` must each run; ``allowed`` (default: ``expected``) may run."""
        done = collections.Counter(
            parts[1]
            for line in project.runs()
            if len(parts := line.split()) == 3 and parts[0] == "done"
        )
        allowed = expected if allowed is None else allowed
        tally = cls(
            broker=broker,
            scenario=scenario,
            expected=len(expected),
            lost=sorted(expected - set(done), key=_number),
            duplicates=sum(n - 1 for n in done.values()),
            max_duplicates=max((n - 1 for n in done.values()), default=0),
            unexpected=sorted(set(done) - allowed, key=_number),
        )
        tally.save()
        return tally

    def save(self) -> None:
        RESULTS.append(self)
        if REPORT:
            with open(REPORT, "a") as f:
                f.write(
                    json.dumps(
                        {
                            **asdict(self),
                            "lost": len(self.lost),
                            "unexpected": len(self.unexpected),
                            "pending": len(self.pending),
                            "blamed": len(self.blamed),
                        }
                    )
                    + "\n"
                )

    def __str__(self) -> str:
        return (
            f"{self.broker}/{self.scenario}: {self.expected} expected, "
            f"{len(self.lost)} lost {self.lost[:10]}, {self.duplicates} duplicates "
            f"(at most {self.max_duplicates + 1} runs of one task), "
            f"{len(self.unexpected)} unexpected {self.unexpected[:10]}, "
            f"{len(self.pending)} pending {self.pending[:10]}, "
            f"{len(self.blamed)} innocents blamed {self.blamed[:10]}"
        )


#: Every tally of this session, for the summary printed at its end (conftest.py).
RESULTS: list[Tally] = []


def _number(text: str) -> int:
    return int(text) if text.isdigit() else -1


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``predicate`` until it holds; an ``AssertionError`` naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


class Fleet:
    """Worker processes of one trial; whatever is still running at the end is killed,
    children included (a supervisor's children run in their own process groups)."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.procs: list[subprocess.Popen[str]] = []
        self.orphans: list[psutil.Process] = []

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        proc = self.project.popen(*args, **{**ENV, **env})
        self.procs.append(proc)
        return proc

    def children(self, proc: subprocess.Popen[str]) -> list[psutil.Process]:
        """The live worker processes of a supervisor (remembered, to be killed at the end)."""
        try:
            found = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.orphans += found
        return [c for c in found if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]

    def wait(self, proc: subprocess.Popen[str], timeout: float = DEADLINE) -> int | None:
        """Its exit status, or ``None`` when it did not exit in time (it is killed then)."""
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.children(proc)
            proc.kill()
            proc.wait()
            return None

    def close(self) -> None:
        for proc in self.procs:
            self.children(proc)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for child in self.orphans:
            with contextlib.suppress(psutil.Error):
                child.kill()


def burst(project: Project, timeout: float = DEADLINE) -> tuple[int | None, str]:
    """Run a ``--burst`` worker until the queue is drained: (exit status or None, its log)."""
    try:
        out = project.hurtle("worker", "tasks:app", "--burst", timeout=timeout, **ENV)
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        return None, stderr
    return out.returncode, out.stderr


def kill_at_random_moment(
    project: Project,
    proc: subprocess.Popen[str],
    rng: random.Random,
    total: int,
    pid: int | None = None,
) -> None:
    """SIGKILL ``pid`` (default: ``proc``) at a random moment of its work on ``total`` tasks:
    sometimes during its start, usually once a random number of tasks are done, plus a random
    fraction of a batch."""
    if rng.random() < 0.15:
        time.sleep(rng.uniform(0.0, 0.6))
    else:
        at = rng.randrange(1, total)
        wait_until(lambda: done_count(project) >= at or proc.poll() is not None, f"{at} tasks done")
        time.sleep(rng.uniform(0.0, 0.03))
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid if pid is None else pid, signal.SIGKILL)


def done_by(project: Project) -> dict[str, set[int]]:
    """Task numbers done, by the pid that ran them."""
    by: dict[str, set[int]] = collections.defaultdict(set)
    for line in project.runs():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "done":
            by[parts[2]].add(int(parts[1]))
    return by


def both_carry_on(
    project: Project,
    workers: Sequence[subprocess.Popen[str]],
    returned: Sequence[int],
    after: int,
    more: int,
    event: str,
) -> None:
    """Wait until every worker ran a task numbered ``after`` or later (published after
    ``event``; a worker that exited ends the wait, for the caller to report), then until ``more``
    further sends returned."""

    def carried_on() -> bool:
        pids = {str(w.pid) for w in workers}
        later = {pid for pid, ns in done_by(project).items() if max(ns) >= after}
        return pids <= later or any(w.poll() is not None for w in workers)

    wait_until(carried_on, f"both workers to run tasks published after the {event}")
    wanted = len(returned) + more
    wait_until(lambda: len(returned) >= wanted, f"publishing to carry on after the {event}")


class Publisher:
    """A thread that sends numbered ``chaos.work`` tasks in batches of 1 to 30 while the servers
    fail under it: ``returned`` holds the numbers whose ``send_many`` returned (they must run),
    ``uncertain`` those whose ``send_many`` raised (stored or not), ``errors`` the raised
    messages, their numbers and the URL masked. ``rng`` is the thread's own, to stay
    reproducible."""

    def __init__(
        self, project: Project, rng: random.Random, seconds: float, returned: list[int]
    ) -> None:
        self.project = project
        self.returned = returned
        self.uncertain: list[int] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self._rng = rng
        self._seconds = seconds
        self._next = max(returned, default=-1) + 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        url = self.project.url
        while not self._stop.is_set():
            size = self._rng.randint(1, 30)
            batch = list(range(self._next, self._next + size))
            self._next += size
            try:
                self.project.send_many("chaos.work", [(i, self._seconds) for i in batch])
            except BrokerError as err:
                self.uncertain.extend(batch)
                self.errors[re.sub(r"\d+", "N", str(err).replace(url, "URL"))[:110]] += 1
            else:
                self.returned.extend(batch)
            self._stop.wait(0.01)  # about as fast as the two workers run them

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE)

    def next_number(self) -> int:
        """The first number not sent yet: what is published from now on is at least it."""
        return max(self.returned + self.uncertain, default=-1) + 1
