"""PostgreSQL itself fails under load: a private server (``initdb`` + ``pg_ctl``) stopped at once
(``pg_ctl stop -m immediate``: every backend quits, no checkpoint, crash recovery at the next
start) while a publisher sends and two workers (solo and threads) consume, then started again on
the same port — at once, or after a random while during which the workers have noticed.

The promises: no publish that returned is lost, and nothing runs that was never sent; both
workers ride out the restart and run tasks published after it; they stop with exit status 0.
A task may run twice only if a worker held it when the server went away — an acknowledgement
that did not commit, or deliveries taken back from a worker that could not beat for longer than
the heartbeat timeout — so duplicates stay within what the two workers hold.
"""

from __future__ import annotations

import random
import signal
import time
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
from postgres_server import PostgresServer

SECONDS = 0.001  # per task
WORKERS = {
    "solo": ("--pool", "solo"),
    "threads": ("--pool", "threads", "--concurrency", str(THREADS)),
}
#: What the two workers can hold between them when the server goes away.
HELD = sum(HOLD[pool] for pool in WORKERS)
#: What a worker logs when the server does not answer.
FAILURES = ("fetch failed", "could not settle", "heartbeat failed")
#: How the server is brought back: started again at once, or after a random outage.
BLOWS = ["restarted", "away for a while"]


@pytest.fixture
def project(postgres_private: PostgresServer, tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, TASK_NAMES, f"{postgres_private.url}?schema=chaos")
    yield p
    p.app.close()


@pytest.fixture
def fleet(project: Project) -> Iterator[Fleet]:
    f = Fleet(project)
    yield f
    f.close()


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("blow", BLOWS)
def test_postgres_stopped_at_once_under_load_loses_no_publish_that_returned(
    project: Project,
    postgres_private: PostgresServer,
    fleet: Fleet,
    blow: str,
    trial: int,
) -> None:
    rng = trial_rng(f"postgres-{blow}", trial)
    workers = [fleet.start("worker", "tasks:app", *args) for args in WORKERS.values()]
    # the blow falls on running workers (one that cannot open its broker at its start exits 2)
    wait_until(
        lambda: all(" consuming " in project.output(w) or w.poll() is not None for w in workers),
        "the workers to start consuming",
        timeout=2 * DEADLINE,
    )
    # the publisher thread's own random numbers, to stay reproducible
    publisher = Publisher(project, random.Random(rng.random()), SECONDS, returned=[])
    returned, uncertain = publisher.returned, publisher.uncertain
    publisher.start()
    try:
        before = rng.randrange(1, 2000)
        wait_until(lambda: len(returned) >= before, f"{before} published")
        stopped_at = len(returned)
        postgres_private.stop()  # pg_ctl stop -m immediate: publisher and workers busy
        if blow == "away for a while":
            wait_until(
                lambda: any(
                    w.poll() is not None or any(f in project.output(w) for f in FAILURES)
                    for w in workers
                ),
                "a worker to notice that PostgreSQL is away",
            )
            time.sleep(rng.uniform(0.0, 2.0))  # the outage lasts a random while
        postgres_private.start()
        # what is published from now on went to the restarted server
        after = publisher.next_number()

        both_carry_on(project, workers, returned, after, rng.randrange(1, 500), "restart")
    finally:
        publisher.stop()

    sent = {str(i) for i in returned}
    try:
        wait_until(
            lambda: (
                sent <= set(project.lines("done")) or any(w.poll() is not None for w in workers)
            ),
            "the workers to run every publish that returned",
        )
    except AssertionError as err:  # say what was left, and where, for the next look
        left = sorted(sent - set(project.lines("done")), key=int)
        logs = "\n".join(project.output(w)[-3000:] for w in workers)
        raise AssertionError(
            f"{err}: {len(left)} not run {left[:20]}, {project.stats()}\n{logs}"
        ) from None
    for w in workers:
        w.send_signal(signal.SIGTERM)
    codes = [fleet.wait(w) for w in workers]
    logs = "\n".join(project.output(w)[-2000:] for w in workers)
    by_worker = done_by(project)
    # what a worker had handed back at its stop (none is expected) runs now
    code, log = burst(project)
    tally = Tally.of(
        project,
        "postgres",
        f"PostgreSQL stopped at once and {blow} during publish and consume",
        sent,
        sent | {str(i) for i in uncertain},
    )
    print(
        f"stopped after {stopped_at} publishes returned; {len(returned)} returned, "
        f"{len(uncertain)} raised; {tally}; errors: {dict(publisher.errors)}"
    )
    assert codes == [0, 0], f"{codes}\n{logs}"
    assert code == 0, log[-3000:]
    assert all(max(by_worker.get(str(w.pid), {-1})) >= after for w in workers), by_worker.keys()
    assert not tally.lost, f"{tally}\n{logs}"
    assert not tally.unexpected, tally
    assert tally.duplicates <= HELD, f"{tally}\n{logs}"
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}
