"""A NATS cluster loses the leader of the queue's stream under load: publishers sending, workers
consuming, the leader SIGKILLed at a random moment, a new one elected among the two left.

Each trial starts a cluster of its own (three ``nats-server -js``, routed on loopback), whose
streams and KV buckets hurtle makes with three replicas (the default on a cluster of three),
two workers (solo and threads) on the queue, and a publisher thread sending numbered tasks in
batches of random size. At a random moment it kills the server leading the queue's stream,
waits until the stream has a new leader, and keeps publishing until both workers have run tasks
published after the election — the killed server still down. Then it starts the killed server
again (it catches up from its store and the others), lets the workers drain the queue, stops
them, and counts the runs. A fetch whose reply was lost with the leader leaves its messages
delivered to nobody until JetStream's ``AckWait`` (60 s) hands them out again: the drain waits
for that.

JetStream acknowledges a publish once a majority of the stream's replicas stored it, so every
publish that returned must survive the leader's death: none may be lost. A publish that raised
may have been stored all the same. A task may run twice only if a worker held it when the leader
died (an acknowledgement the new leader never received), so duplicates stay within what the two
workers hold.
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

from helpers import Project
from nats_server import NatsCluster, nats_cluster  # noqa: F401 - fixture

pytest.importorskip("nats")

from hurtle.brokers.nats import names

SECONDS = 0.001  # per task
#: Longer than an election and a client's move to another server (a few seconds, up to about 20
#: on a loaded machine), so that the workers' deliveries are seldom taken from them while they
#: cannot beat: hurtle's default, as in production.
HEARTBEAT_TIMEOUT = "20"
#: JetStream's ``AckWait`` for the queue's consumers (``max(60, 2 * heartbeat timeout)`` of the
#: broker that made them, the test's own): a fetch whose reply was lost with the leader leaves its
#: messages delivered to nobody, and they come back only after it.
ACK_WAIT = 60.0
WORKERS = {
    "solo": ("--pool", "solo"),
    "threads": ("--pool", "threads", "--concurrency", str(THREADS)),
}
#: What the two workers can hold between them when the leader dies.
HELD = sum(HOLD[pool] for pool in WORKERS)
STREAM = names.stream("default")


@pytest.fixture
def project(nats_cluster: NatsCluster, tmp_path: Path) -> Iterator[Project]:  # noqa: F811
    (tmp_path / "project").mkdir()
    p = Project(tmp_path / "project", TASKS, TASK_NAMES, nats_cluster.url)
    yield p
    p.app.close()


@pytest.fixture
def fleet(project: Project) -> Iterator[Fleet]:
    f = Fleet(project)
    yield f
    f.close()


@pytest.mark.timeout(400)  # a drain may wait out AckWait
@pytest.mark.parametrize("trial", range(TRIALS))
def test_nats_stream_leader_killed_under_load_loses_no_publish_that_returned(
    project: Project,
    nats_cluster: NatsCluster,  # noqa: F811
    fleet: Fleet,
    trial: int,
) -> None:
    rng = trial_rng("nats-kill-leader", trial)
    project.send_many("chaos.work", [(-1, 0)])  # the stream exists: it has a leader to kill
    workers = [
        fleet.start("worker", "tasks:app", *args, HURTLE_HEARTBEAT_TIMEOUT=HEARTBEAT_TIMEOUT)
        for args in WORKERS.values()
    ]
    wait_until(
        lambda: all(" consuming " in project.output(w) or w.poll() is not None for w in workers),
        "the workers to start consuming",
    )
    # the publisher thread's own random numbers, to stay reproducible
    publisher = Publisher(project, random.Random(rng.random()), SECONDS, returned=[-1])
    returned, uncertain = publisher.returned, publisher.uncertain
    publisher.start()
    leader = nats_cluster.leader(STREAM)
    assert leader is not None
    try:
        before = rng.randrange(1, 1500)
        wait_until(lambda: len(returned) >= before, f"{before} published")
        leader.kill()  # SIGKILL, publishers and workers busy
        killed_at = len(returned)
        wait_until(
            lambda: (new := nats_cluster.leader(STREAM)) is not None and new is not leader,
            "a new leader of the queue's stream",
        )
        # what is published from now on went to the new leader
        after = publisher.next_number()

        both_carry_on(project, workers, returned, after, rng.randrange(1, 300), "election")
    finally:
        publisher.stop()
    leader.start()  # back from its store, on the same ports; it catches up
    nats_cluster.wait_ready()

    sent = {str(i) for i in returned}
    # what a lost fetch reply left delivered to nobody comes back after AckWait; the rest is
    # run at the workers' pace (a few hundred a second each on a loaded machine)
    drain = ACK_WAIT + DEADLINE + len(sent - set(project.lines("done"))) / 100
    try:
        wait_until(
            lambda: sent <= set(project.lines("done")), "the workers to run every task", drain
        )
    except AssertionError as err:
        missing = sorted(sent - set(project.lines("done")), key=int)
        raise AssertionError(
            f"{err}: {len(missing)} not done {missing[:20]}, queue {project.stats()}, "
            f"killed after {killed_at} of {len(returned)}"
        ) from None
    for w in workers:
        w.send_signal(signal.SIGTERM)
    codes = [fleet.wait(w) for w in workers]
    logs = "\n".join(project.output(w)[-2000:] for w in workers)
    by_worker = done_by(project)
    # what a stopping worker handed back, or held when an acknowledgement was lost, runs now
    code, log = burst(project, ACK_WAIT + DEADLINE)
    tally = Tally.of(
        project,
        "nats-cluster",
        "stream leader SIGKILLed during publish and consume (replicas=3)",
        sent,
        sent | {str(i) for i in uncertain},
    )
    print(
        f"killed leader {leader.name} after {killed_at} publishes returned; {len(returned)} "
        f"returned, {len(uncertain)} raised; {tally}; errors: {dict(publisher.errors)}"
    )
    assert codes == [0, 0], logs
    assert code == 0, log[-3000:]
    assert all(max(by_worker.get(str(w.pid), {-1})) >= after for w in workers), by_worker.keys()
    assert not tally.lost, tally
    assert not tally.unexpected, tally
    assert tally.duplicates <= HELD, tally
