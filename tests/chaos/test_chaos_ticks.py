"""Periodic ticks under chaos: three worker processes schedule an ``every=1`` task while the
broker's server (Redis with AOF, ``appendfsync always``; a private PostgreSQL) is SIGKILLed and
restarted, stopped for a while and started again, each at a random moment around a tick, and a
worker is SIGKILLed (and another started).

The promise: every tick of the window is enqueued exactly once — one message per tick, none
missing from the first tick to the last the broker recorded. A message may *run* twice (the
killed worker's, redelivered), but never two messages for one tick.
"""

from __future__ import annotations

import collections
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from chaos_support import DEADLINE, ENV, TRIALS, Fleet, Tally, trial_rng, wait_until

from helpers import Project, RedisServer
from postgres_server import PostgresServer

pytest.importorskip("redis")

# The task logs the tick of each message it runs (from the header the scheduler sets), with the
# message id: a tick enqueued twice shows as two ids.
TASKS = """
import os

from hurtle import Hurtle
from hurtle.middleware import Middleware


class TickLog(Middleware):
    def before_process(self, job):
        message = job.message
        with open(os.environ["RUNS_LOG"], "a") as f:
            f.write(f"tick {message.headers['tick']!r} {message.id} {os.getpid()}\\n")


app = Hurtle(middleware=[TickLog()])


@app.periodic(every=1)
@app.task(name="chaos.beat", retries=0)
def beat():
    pass
"""
WORKERS = 3
#: Seconds of ticks the window holds after the last blow, so that what was owed is claimed.
SETTLE = 3.0


@pytest.fixture(params=["redis", "postgres"])
def server(
    request: pytest.FixtureRequest, make_redis_server: Callable[..., RedisServer]
) -> RedisServer | PostgresServer:
    if request.param == "redis":
        return make_redis_server(appendonly=True)
    private: PostgresServer = request.getfixturevalue("postgres_private")
    return private


@pytest.fixture
def project(server: RedisServer | PostgresServer, tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, [], server.url)
    yield p
    p.app.close()


@pytest.fixture
def fleet(project: Project) -> Iterator[Fleet]:
    f = Fleet(project)
    yield f
    f.close()


def ticks_run(project: Project) -> dict[float, set[str]]:
    """Tick -> the ids of the messages that ran for it."""
    out: dict[float, set[str]] = collections.defaultdict(set)
    for line in project.runs():
        word, tick, mid, _ = line.split()
        assert word == "tick", line
        out[float(tick)].add(mid)
    return out


def near_a_tick(rng: random.Random) -> None:
    """Sleep until a random moment within 0.2 s of the next whole second (a tick)."""
    target = float(int(time.time()) + 1 + rng.randrange(0, 2)) + rng.uniform(-0.2, 0.2)
    time.sleep(max(0.0, target - time.time()))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("trial", range(TRIALS))
def test_every_tick_is_enqueued_once_through_server_restarts_and_a_killed_worker(
    project: Project, server: RedisServer | PostgresServer, fleet: Fleet, trial: int
) -> None:
    kind = "redis" if isinstance(server, RedisServer) else "postgres"
    rng = trial_rng("ticks" if kind == "redis" else "ticks-postgres", trial)
    workers = [fleet.start("worker", "tasks:app", "--pool", "solo") for _ in range(WORKERS)]
    wait_until(
        lambda: all("scheduler:" in project.output(w) for w in workers),
        "the workers' schedulers to start",
        timeout=2 * DEADLINE,
    )
    wait_until(lambda: len(ticks_run(project)) >= 2, "the first ticks to run")

    blows = ["server killed", "server away", "worker killed"]
    rng.shuffle(blows)
    for blow in blows:
        near_a_tick(rng)
        if blow == "server killed":
            server.kill()
            server.start()
        elif blow == "server away":
            server.stop()
            time.sleep(rng.uniform(0.5, 2.5))
            server.start()
        else:
            victim = workers.pop(rng.randrange(len(workers)))
            victim.send_signal(signal.SIGKILL)
            workers.append(fleet.start("worker", "tasks:app", "--pool", "solo"))
        print(f"{blow} at {time.time():.3f}")
    after = time.time() + SETTLE
    wait_until(lambda: max(ticks_run(project), default=0.0) >= after, "ticks after the blows")
    # the replacement too has started (a SIGTERM before its handlers are set kills it: -15)
    wait_until(
        lambda: all("scheduler:" in project.output(w) for w in workers),
        "the replacement's scheduler to start",
        timeout=2 * DEADLINE,
    )

    for w in workers:
        w.send_signal(signal.SIGTERM)
    codes = [fleet.wait(w) for w in workers]
    logs = "\n".join(project.output(w)[-2000:] for w in workers)
    # what a stopped worker handed back, or the killed one held, runs now: by a worker that
    # schedules nothing (one that did could claim a tick after its queue ran dry)
    drain = project.hurtle("worker", "tasks:app", "--burst", "--no-scheduler", **ENV)
    assert drain.returncode == 0, drain.stderr[-3000:]

    seen = ticks_run(project)
    last = project.app.broker.last_tick("default", "chaos.beat")
    assert last is not None
    first = min(seen)
    expected = {first + i for i in range(round(last - first) + 1)}
    tally = Tally(
        broker=kind,
        scenario="periodic ticks (every=1): server restarted, a worker SIGKILLed",
        expected=len(expected),
        lost=[repr(t) for t in sorted(expected - set(seen))],
        duplicates=sum(len(ids) - 1 for ids in seen.values()),
        max_duplicates=max(len(ids) - 1 for ids in seen.values()),
        unexpected=[repr(t) for t in sorted(set(seen) - expected)],
    )
    tally.save()
    print(tally)
    assert codes == [0] * len(workers), f"{codes}\n{logs}"
    assert not tally.lost, f"{tally}\n{logs}"
    assert not tally.duplicates, f"ticks enqueued more than once: {tally}\n{logs}"
    assert not tally.unexpected, f"{tally}\n{logs}"
