"""Redis itself fails: killed and restarted (AOF, ``appendfsync always``) while messages are
published or consumed, and stopped for a while (then started again on the same port) while a
worker consumes and while it shuts down.

The promises: no publish that returned is lost; a worker rides out the outage or the restart and
drains its queue (``--burst`` exits 0); a worker stopped while the broker is away still records
the outcomes of the tasks it ran once the broker is back, so none runs again.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chaos_support import (
    DEADLINE,
    HOLD,
    TASK_NAMES,
    TASKS,
    THREADS,
    TRIALS,
    Fleet,
    Tally,
    burst,
    done_count,
    trial_rng,
    wait_until,
)

from helpers import Project, RedisServer

pytest.importorskip("redis")

from hurtle.errors import BrokerError

TOTAL = 300
SECONDS = 0.002
POOL_ARGS = {
    "solo": ("--pool", "solo"),
    "threads": ("--pool", "threads", "--concurrency", str(THREADS)),
}
#: What a worker logs when the broker does not answer.
FAILURES = ("fetch failed", "could not settle", "heartbeat failed", "cannot reach Redis")


@pytest.fixture
def server(make_redis_server: Callable[..., RedisServer]) -> RedisServer:
    return make_redis_server(appendonly=True)


@pytest.fixture
def project(server: RedisServer, tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, TASK_NAMES, server.url)
    yield p
    p.app.close()


@pytest.fixture
def fleet(project: Project) -> Iterator[Fleet]:
    f = Fleet(project)
    yield f
    f.close()


def numbers(n: int = TOTAL) -> set[str]:
    return {str(i) for i in range(n)}


def finish(project: Project, fleet: Fleet, worker: Any) -> tuple[int | None, str]:
    """Wait for ``worker`` to exit; then drain whatever it left with a burst worker (so that
    the tally counts every task even when the worker failed)."""
    code = fleet.wait(worker)
    log = project.output(worker)
    if code is None:  # killed at the deadline: say what it still held
        log += f"\n[still running after {DEADLINE:g}s; queue then: {project.stats()}]"
    burst(project)
    return code, log


@pytest.mark.parametrize("trial", range(TRIALS))
def test_redis_killed_during_publish_loses_no_publish_that_returned(
    project: Project, server: RedisServer, trial: int
) -> None:
    rng = trial_rng("redis-kill-publish", trial)
    returned: list[int] = []  # numbers whose send_many returned
    uncertain: list[int] = []  # numbers whose send_many raised: stored or not
    stop = threading.Event()

    def publish() -> None:
        n = 0
        while not stop.is_set():
            size = sizes.randint(1, 30)
            batch = list(range(n, n + size))
            n += size
            try:
                project.send_many("chaos.work", [(i, 0) for i in batch])
            except BrokerError:
                uncertain.extend(batch)
                stop.wait(0.01)
            else:
                returned.extend(batch)

    sizes = random.Random(rng.random())  # the publisher thread's own, to stay reproducible
    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        before = rng.randrange(1, 2000)
        wait_until(lambda: len(returned) >= before, f"{before} published")
        server.kill()
        server.start()
        after = len(returned) + rng.randrange(1, 500)
        wait_until(lambda: len(returned) >= after, "publishing to carry on after the restart")
    finally:
        stop.set()
        publisher.join(DEADLINE)

    code, log = burst(project, timeout=2 * DEADLINE)
    tally = Tally.of(
        project,
        "redis",
        "Redis SIGKILLed and restarted during publish",
        {str(i) for i in returned},
        {str(i) for i in returned + uncertain},
    )
    print(f"{len(returned)} publishes returned, {len(uncertain)} raised")
    assert code == 0, log[-3000:]
    assert not tally.lost, tally
    assert not tally.unexpected, tally


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_redis_killed_during_consume_loses_nothing_and_the_worker_carries_on(
    project: Project, server: RedisServer, fleet: Fleet, pool: str, trial: int
) -> None:
    rng = trial_rng(f"redis-kill-consume-{pool}", trial)
    project.send_many("chaos.work", [(i, SECONDS) for i in range(TOTAL)])
    worker = fleet.start("worker", "tasks:app", *POOL_ARGS[pool], "--burst")
    at = rng.randrange(1, TOTAL)
    wait_until(lambda: done_count(project) >= at or worker.poll() is not None, f"{at} done")
    server.kill()
    server.start()

    code, log = finish(project, fleet, worker)
    tally = Tally.of(
        project, "redis", f"Redis SIGKILLed and restarted during consume ({pool})", numbers()
    )
    assert code == 0, f"the worker did not ride out the restart: {code}\n{log[-3000:]}"
    assert not tally.lost, tally
    assert tally.duplicates <= HOLD[pool], tally


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_redis_away_for_a_while_during_consume_loses_nothing(
    project: Project, server: RedisServer, fleet: Fleet, pool: str, trial: int
) -> None:
    rng = trial_rng(f"redis-outage-consume-{pool}", trial)
    project.send_many("chaos.work", [(i, SECONDS) for i in range(TOTAL)])
    worker = fleet.start("worker", "tasks:app", *POOL_ARGS[pool], "--burst")
    at = rng.randrange(1, TOTAL)
    wait_until(lambda: done_count(project) >= at or worker.poll() is not None, f"{at} done")
    server.stop()
    wait_until(
        lambda: worker.poll() is not None or any(f in project.output(worker) for f in FAILURES),
        "the worker to notice that Redis is away",
    )
    time.sleep(rng.uniform(0.0, 2.0))  # the outage lasts a random while: the chaos itself
    server.start()

    code, log = finish(project, fleet, worker)
    tally = Tally.of(
        project, "redis", f"Redis stopped for a while during consume ({pool})", numbers()
    )
    assert code == 0, f"the worker did not ride out the outage: {code}\n{log[-3000:]}"
    assert not tally.lost, tally
    assert tally.duplicates <= HOLD[pool], tally


@pytest.mark.parametrize("trial", range(TRIALS))
def test_redis_away_at_shutdown_the_worker_records_its_outcomes_once_it_is_back(
    project: Project, server: RedisServer, fleet: Fleet, trial: int
) -> None:
    rng = trial_rng("redis-outage-shutdown", trial)
    total = 200
    project.send_many("chaos.work", [(i, 0.01) for i in range(total)])
    worker = fleet.start("worker", "tasks:app")
    at = rng.randrange(1, total // 2)
    wait_until(lambda: done_count(project) >= at or worker.poll() is not None, f"{at} done")
    server.stop()
    worker.send_signal(signal.SIGTERM)
    wait_until(
        lambda: (
            worker.poll() is not None
            or (
                "stopping gracefully" in (out := project.output(worker))
                and any(f in out for f in FAILURES)
            )
        ),
        "the worker to stop while Redis is away",
    )
    time.sleep(rng.uniform(0.0, 1.5))  # a random outage, within the acker's 10 s at stop
    server.start()

    code = fleet.wait(worker)
    log = project.output(worker)
    burst(project)
    tally = Tally.of(
        project, "redis", "Redis stopped for a while at worker shutdown", numbers(total)
    )
    assert code == 0, log[-3000:]
    assert not tally.lost, tally
    # The worker was never killed: every task it ran must have been recorded as done.
    assert tally.duplicates == 0, f"{tally}\n{log[-3000:]}"
