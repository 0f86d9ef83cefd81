"""A Redis Cluster master SIGKILLed under load: publishers sending, workers consuming, the queue's
master killed at a random moment, its replica promoted.

Each trial starts a cluster of its own (three masters, three replicas), two workers (solo and
threads) on the queue, and a publisher thread sending numbered tasks in batches of random size.
At a random moment it kills the master serving the queue's slot, waits until the cluster has
promoted its replica, and keeps publishing until both workers have run tasks published after
the promotion. Then it lets the workers drain the queue, stops them, and counts the runs.

With ``?wait_replicas=1`` every publish that returned had reached the replica: none may be lost.
Without it, a publish acknowledged by the master just before it died may be missing on the
replica: the test records such losses (``HURTLE_CHAOS_REPORT``) but cannot forbid them
(docs/deploying.md, "On a Redis Cluster"). In both, the workers must carry on after the
promotion, and a task may run twice only if a worker held it when the master died — a fetch or
an acknowledgement the replica never received — so duplicates stay within what two workers hold.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_support import (
    DEADLINE,
    HOLD,
    TASK_NAMES,
    TASKS,
    THREADS,
    TRIALS,
    Fleet,
    Publisher,
    Tally,
    both_carry_on,
    burst,
    done_by,
    trial_rng,
    wait_until,
)

from helpers import Project, RedisClusterServer

pytest.importorskip("redis")

from hurtle.brokers.keys import queue_keys

SECONDS = 0.001  # per task
#: Longer than a failover (``RedisClusterServer.NODE_TIMEOUT`` plus the election), so that the
#: workers' deliveries are not taken from them while they cannot beat: as in production, where
#: the default heartbeat timeout (20 s) exceeds the default ``cluster-node-timeout`` (15 s).
HEARTBEAT_TIMEOUT = "10"
WORKERS = {
    "solo": ("--pool", "solo"),
    "threads": ("--pool", "threads", "--concurrency", str(THREADS)),
}
#: What the two workers can hold between them when the master dies.
HELD = sum(HOLD[pool] for pool in WORKERS)
URLS = {"wait_replicas=1": "?wait_replicas=1&wait_timeout=5", "no wait": ""}


@pytest.fixture
def cluster(make_redis_cluster: type[RedisClusterServer]) -> RedisClusterServer:
    return make_redis_cluster()


@pytest.fixture(params=list(URLS))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def project(cluster: RedisClusterServer, mode: str, tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, TASK_NAMES, cluster.url + URLS[mode])
    yield p
    p.app.close()


@pytest.fixture
def fleet(project: Project) -> Iterator[Fleet]:
    f = Fleet(project)
    yield f
    f.close()


@pytest.mark.parametrize("trial", range(TRIALS))
def test_cluster_master_killed_under_load_loses_no_publish_that_returned_with_wait_replicas(
    project: Project, cluster: RedisClusterServer, fleet: Fleet, mode: str, trial: int
) -> None:
    rng = trial_rng(f"cluster-kill-master-{mode}", trial)
    workers = [
        fleet.start("worker", "tasks:app", *args, HURTLE_HEARTBEAT_TIMEOUT=HEARTBEAT_TIMEOUT)
        for args in WORKERS.values()
    ]
    # the publisher thread's own random numbers, to stay reproducible
    publisher = Publisher(project, random.Random(rng.random()), SECONDS, returned=[])
    returned, uncertain = publisher.returned, publisher.uncertain
    publisher.start()
    master = cluster.master_of(queue_keys("default").wake)
    try:
        before = rng.randrange(1, 2000)
        wait_until(lambda: len(returned) >= before, f"{before} published")
        cluster.kill(master)  # SIGKILL, publishers and workers busy
        killed_at = len(returned)
        cluster.wait_ok(DEADLINE)
        promoted = cluster.master_of(queue_keys("default").wake)
        assert promoted != master
        # restarted (empty: no persistence), the old master rejoins as the new one's replica;
        # until it is in sync a publish with WAIT raises, having stored its messages
        cluster.start_node(master)
        cluster.wait_ok(DEADLINE)
        # what is published from now on went to the promoted replica
        after = publisher.next_number()

        both_carry_on(project, workers, returned, after, rng.randrange(1, 500), "promotion")
    finally:
        publisher.stop()

    # the workers drain what they can reach; without WAIT some numbers may never come
    sent = {str(i) for i in returned}
    wait_until(
        lambda: sent <= set(project.lines("done")) or project.stats()["ready"] == 0,
        "the workers to drain the queue",
    )
    for w in workers:
        w.send_signal(signal.SIGTERM)
    codes = [fleet.wait(w) for w in workers]
    logs = "\n".join(project.output(w)[-2000:] for w in workers)
    by_worker = done_by(project)
    # what a live worker held but whose acknowledgement the replica never got went back at its
    # stop: a burst worker runs it (again)
    code, log = burst(project)
    tally = Tally.of(
        project,
        "redis-cluster",
        f"master SIGKILLed during publish and consume ({mode})",
        sent,
        sent | {str(i) for i in uncertain},
    )
    print(
        f"killed master {master} after {killed_at} publishes returned; {len(returned)} returned, "
        f"{len(uncertain)} raised; {tally}; errors: {dict(publisher.errors)}"
    )
    assert codes == [0, 0], logs
    assert code == 0, log[-3000:]
    assert all(max(by_worker.get(str(w.pid), {-1})) >= after for w in workers), by_worker.keys()
    assert not tally.unexpected, tally
    assert tally.duplicates <= HELD, tally
    if mode == "wait_replicas=1":
        assert not tally.lost, tally
