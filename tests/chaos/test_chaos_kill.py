"""SIGKILL at random moments, on SQLite and Redis: nothing is lost, and only what the dead
process held may run twice.

Each trial sends ``TOTAL`` numbered tasks, starts workers, kills one process at a random moment
(a solo worker, a threads worker, a child of ``--processes``, or the supervisor itself), then lets
a ``--burst`` worker (or the supervisor's own children) finish the queue, and counts the runs.

The bound on duplicates, and why. A task runs twice only if its message was still in flight when
its worker died: taken, maybe run, but its outcome not yet recorded. So:

* where nothing else runs after the kill (a solo or threads worker, the supervisor), the test
  reads ``in_flight`` right after the kill — exactly what the dead processes held — and asserts
  ``duplicates <= in_flight``;
* in every scenario it asserts ``in_flight`` (or the duplicates, when a sibling runs on) is at
  most ``HOLD[pool]`` per killed worker (see ``chaos_support.HOLD``: batch, prefetch and one
  batch of outcomes not yet flushed).
"""

from __future__ import annotations

import psutil
import pytest
from chaos_support import (
    DEADLINE,
    HOLD,
    THREADS,
    TRIALS,
    Fleet,
    Tally,
    burst,
    kill_at_random_moment,
    trial_rng,
    wait_until,
)

from helpers import Project

TOTAL = 300
SECONDS = 0.002  # per task: a solo batch (20 tasks) is ~40 ms of work
EMPTY = {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}
POOL_ARGS = {
    "solo": ("--pool", "solo"),
    "threads": ("--pool", "threads", "--concurrency", str(THREADS)),
}


def numbers() -> set[str]:
    return {str(i) for i in range(TOTAL)}


def send_all(project: Project) -> None:
    project.send_many("chaos.work", [(i, SECONDS) for i in range(TOTAL)])


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_sigkill_of_a_worker_loses_nothing_and_reruns_only_what_it_held(
    project: Project, fleet: Fleet, broker: str, pool: str, trial: int
) -> None:
    rng = trial_rng(f"kill-{pool}-{broker}", trial)
    send_all(project)
    victim = fleet.start("worker", "tasks:app", *POOL_ARGS[pool])
    kill_at_random_moment(project, victim, rng, TOTAL)
    victim.wait(DEADLINE)
    held = project.stats()["in_flight"]  # nothing else runs: what the dead worker held

    code, log = burst(project)
    tally = Tally.of(project, broker, f"SIGKILL {pool} worker", numbers())
    assert code == 0, f"the rescuing --burst worker exited with {code}:\n{log[-3000:]}"
    assert not tally.lost, tally
    assert tally.duplicates <= held <= HOLD[pool], (tally, f"held {held}")
    assert project.stats() == EMPTY


@pytest.mark.parametrize("trial", range(TRIALS))
def test_sigkill_of_a_processes_child_loses_nothing_and_the_rest_finish(
    project: Project, fleet: Fleet, broker: str, trial: int
) -> None:
    rng = trial_rng(f"kill-child-{broker}", trial)
    send_all(project)
    supervisor = fleet.start("worker", "tasks:app", "--processes", "2", "--burst")
    kills = rng.choice([1, 1, 2])
    for _ in range(kills):
        wait_until(
            lambda: bool(fleet.children(supervisor)) or supervisor.poll() is not None,
            "a worker process",
        )
        children = fleet.children(supervisor)
        if not children:
            break
        victim = rng.choice(children)
        kill_at_random_moment(project, supervisor, rng, TOTAL, pid=victim.pid)

    code = fleet.wait(supervisor)  # its children finish the queue, then it exits
    if code is None:  # still running at the deadline: let a burst worker count what is left
        burst(project)
    tally = Tally.of(project, broker, "SIGKILL a --processes child", numbers())
    assert code == 0, f"supervisor: {code}\n{project.output(supervisor)[-3000:]}"
    assert not tally.lost, tally
    assert tally.duplicates <= kills * HOLD["solo"], tally
    assert project.stats() == EMPTY


@pytest.mark.parametrize("trial", range(TRIALS))
def test_sigkill_of_the_supervisor_stops_its_children_and_loses_nothing(
    project: Project, fleet: Fleet, broker: str, trial: int
) -> None:
    rng = trial_rng(f"kill-supervisor-{broker}", trial)
    send_all(project)
    supervisor = fleet.start("worker", "tasks:app", "--processes", "2")
    wait_until(
        lambda: len(fleet.children(supervisor)) == 2 or supervisor.poll() is not None,
        "two worker processes",
    )
    children = fleet.children(supervisor)
    kill_at_random_moment(project, supervisor, rng, TOTAL)
    supervisor.wait(DEADLINE)
    # The orphaned workers notice that their supervisor is gone and stop gracefully.
    _, alive = psutil.wait_procs(children, timeout=DEADLINE)
    for child in alive:
        child.kill()
    held = project.stats()["in_flight"]  # nothing runs any more: what they left in flight

    code, log = burst(project)
    tally = Tally.of(project, broker, "SIGKILL the supervisor", numbers())
    assert not alive, f"worker processes still running {DEADLINE}s after their supervisor died"
    assert code == 0, f"the rescuing --burst worker exited with {code}:\n{log[-3000:]}"
    assert not tally.lost, tally
    assert tally.duplicates <= held <= 2 * HOLD["solo"], (tally, f"held {held}")
    assert project.stats() == EMPTY
