"""Liveness: who counts as dead, and what happens to what a dead worker held.

Brokers' shared rules are pinned in ``tests/brokers/test_contract.py``; here are the parts that
need real worker processes or one broker's storage.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project, hurtle_env
from hurtle.brokers import QueueStats, make_broker
from hurtle.ids import new_id
from hurtle.message import Message


def _worker_id_of_a_fresh_process() -> str:
    code = (
        "from hurtle import Hurtle\n"
        "from hurtle.worker.worker import Worker\n"
        "print(Worker(Hurtle('memory://'), queues=['q']).worker_id)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=hurtle_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_the_default_worker_id_differs_between_fresh_processes() -> None:
    # a container restarted in place gets the same host name and pid: only the last part of
    # the id tells the new worker from its dead predecessor
    first, second = _worker_id_of_a_fresh_process(), _worker_id_of_a_fresh_process()
    assert first.rsplit(":", 1)[1] != second.rsplit(":", 1)[1]


def test_a_sqlite_file_of_the_previous_schema_is_upgraded_and_keeps_live_workers(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    broker = make_broker(url)
    broker.publish([Message(id=new_id(), task="t", queue="q") for _ in range(3)])
    consumer = broker.consumer(["q"])
    assert len(consumer.fetch(10, 1)) == 3
    broker.close()
    # what the previous version wrote: the worker's last beat, not its deadline
    conn = sqlite3.connect(tmp_path / "hurtle.db")
    conn.execute("ALTER TABLE workers RENAME COLUMN deadline TO last_seen")
    for table in ("deaths", "quarantine", "probes", "rates", "slots", "uniques"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DROP INDEX dead_message")
    conn.execute("ALTER TABLE dead DROP COLUMN message_id")
    conn.execute("UPDATE workers SET last_seen = ?", (time.time(),))
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    upgraded = make_broker(url, heartbeat_timeout=0.1)
    try:
        time.sleep(0.3)
        assert upgraded.recover() == 0  # the worker was alive a moment ago: it keeps its batch
        assert upgraded.stats(["q"])["q"] == QueueStats(in_flight=3)
        upgraded.publish([Message(id=new_id(), task="t", queue="q")])
        assert len(upgraded.consumer(["q"]).fetch(10, 1)) == 1  # the new tables are there too
    finally:
        upgraded.close()


SPIN_TASKS = """
import os
import time

from hurtle import Hurtle

app = Hurtle()


def log(line):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"{line} {os.getpid()}\\n")


@app.task(retries=0)
def spin(name, seconds):
    # computes in Python bytecode, never yielding to the event loop nor making a system call
    log(f"start {name}")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    log(f"done {name}")
"""


@pytest.fixture(params=["sqlite", "redis"])
def spin_project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = str(request.getfixturevalue("redis_url")) if request.param == "redis" else None
    p = Project(tmp_path, SPIN_TASKS, ("tasks.spin",), url)
    yield p
    p.app.close()


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_cpu_bound_task_under_greenlets_does_not_make_its_worker_look_dead(
    spin_project: Project, pool: str
) -> None:
    p = spin_project
    # a timeout with room for a loaded machine: every statement of a beat waits for the GIL
    env = {"HURTLE_HEARTBEAT_TIMEOUT": "2"}
    p.send("tasks.spin", "cpu", 8.0)
    busy = p.popen("worker", "tasks:app", "--pool", pool, **env)
    p.wait_for(lambda: p.lines("start") == ["cpu"])
    # a peer that beats and recovers while the task computes for several heartbeat timeouts,
    # until the queue has nothing ready or in flight
    peer = p.hurtle("worker", "tasks:app", "--burst", timeout=60, **env)
    assert peer.returncode == 0, peer.stderr
    busy.send_signal(signal.SIGTERM)
    assert p.stop(busy) == 0, p.output(busy)
    assert p.lines("start") == ["cpu"], p.runs()
    assert p.lines("done") == ["cpu"], p.runs()
    assert "Traceback" not in p.output(busy), p.output(busy)


GIL_TASKS = """
import time

from hurtle import Hurtle

app = Hurtle()


@app.task(retries=0)
def hold_the_gil(at_least):
    # grows one C call (a big power, which never lets go of the GIL) until it lasted at_least
    n = 100_000
    while True:
        started = time.monotonic()
        pow(3, n)
        if time.monotonic() - started > at_least:
            return
        n = n * 3 // 2
"""


def test_a_worker_whose_heartbeat_a_long_c_call_held_up_says_which_setting_to_raise(
    tmp_path: Path,
) -> None:
    p = Project(tmp_path, GIL_TASKS, ("tasks.hold_the_gil",))
    try:
        p.send("tasks.hold_the_gil", 1.0)
        out = p.hurtle("worker", "tasks:app", "--burst", HURTLE_HEARTBEAT_TIMEOUT="0.3")
    finally:
        p.app.close()
    assert out.returncode == 0, out.stderr
    assert "more than its heartbeat timeout of 0.3s" in out.stderr, out.stderr
    assert "set HURTLE_HEARTBEAT_TIMEOUT above the longest such call" in out.stderr


POISON_TASKS = """
import os

from hurtle import Hurtle

app = Hurtle()


def log(line):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"{line} {os.getpid()}\\n")


@app.task(retries=1)
def work(n):
    log(f"done {n}")


@app.task(retries=1)
def crash():
    log("start crash")
    os._exit(1)
"""


@pytest.fixture(params=["sqlite", "redis"])
def poison_project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = str(request.getfixturevalue("redis_url")) if request.param == "redis" else None
    p = Project(tmp_path, POISON_TASKS, ("tasks.work", "tasks.crash"), url)
    yield p
    p.app.close()


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_task_that_kills_its_worker_becomes_a_dead_letter_and_the_others_all_run(
    poison_project: Project, pool: str
) -> None:
    p = poison_project
    p.send_many("tasks.work", [(i,) for i in range(10)])
    p.send("tasks.crash")
    p.send_many("tasks.work", [(i,) for i in range(10, 20)])
    exits = []
    for _ in range(20):  # a worker restarted each time it dies, until it drains the queue
        out = p.hurtle(
            "worker",
            "tasks:app",
            "--burst",
            "--pool",
            pool,
            timeout=120,
            HURTLE_HEARTBEAT_TIMEOUT="0.5",
        )
        exits.append(out.returncode)
        if out.returncode == 0:
            break
    assert exits[-1] == 0, exits
    # every other task ran (some twice: done just before a crash, not yet acknowledged)
    assert set(p.lines("done")) == {str(i) for i in range(20)}
    crashes = len(p.lines("start"))
    assert 1 < crashes <= 3 + 1  # max_recoveries (3) deaths survived, the next one is the last
    [dead] = p.app.broker.dead_letters("default")
    assert dead.reason.startswith(f"its worker died {crashes} times while holding it"), dead
    assert p.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 1}
