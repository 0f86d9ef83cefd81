"""Limits and unique tasks with real worker processes on Redis: the limits hold across
processes (measured from the tasks' own logs, one clock), and a killed worker's unique lock
ends after ``unique_for``."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project

TASKS = """
import os
import time

from hurtle import Hurtle

app = Hurtle()


def log(*words):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(" ".join(map(str, words)) + "\\n")


@app.task(rate_limit="50/s", retries=0)
def rated(i):
    log("start", i, os.getpid(), repr(time.time()))


@app.task(concurrency_limit=2, retries=0)
def limited(i):
    log("start", i, os.getpid(), repr(time.time()))
    time.sleep(0.02)
    log("done", i, os.getpid(), repr(time.time()))


@app.task(unique_for=10, retries=0)
def once(i, hold):
    log("start", i, os.getpid(), repr(time.time()))
    time.sleep(hold)
    log("done", i, os.getpid(), repr(time.time()))
"""


@pytest.fixture
def project(tmp_path: Path, redis_url: str) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, (), redis_url)
    p.app.task(name="tasks.rated", rate_limit="50/s")(lambda i: None)
    p.app.task(name="tasks.limited", concurrency_limit=2)(lambda i: None)
    p.app.task(name="tasks.once", unique_for=10)(lambda i, hold: None)
    yield p
    p.app.close()


def _events(project: Project, word: str) -> list[tuple[float, str]]:
    return sorted(
        (float(r.split()[3]), r.split()[1]) for r in project.runs() if r.startswith(word + " ")
    )


def _stop_all(project: Project, workers: list[subprocess.Popen[str]]) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        assert project.stop(w) == 0, project.output(w)


def test_three_workers_start_a_rate_limited_task_at_its_rate(project: Project) -> None:
    total = 350  # 7 s of work at 50/s
    project.app.tasks["tasks.rated"].send_many([(i,) for i in range(total)])
    workers = [project.popen("worker", "tasks:app") for _ in range(3)]
    try:
        project.wait_for(lambda: len(project.lines("start")) >= 300, timeout=60)
    finally:
        _stop_all(project, workers)
    starts = [t for t, _ in _events(project, "start")]
    first = starts[0]
    # after the first second (and its burst), the steady rate: 4 s at 50/s
    window = [t for t in starts if first + 1.0 <= t < first + 5.0]
    assert 180 <= len(window) <= 220, len(window)
    assert len({r.split()[2] for r in project.runs()}) > 1  # the workers shared the work
    assert project.app.broker.dead_letters("default") == []
    assert len(set(project.lines("start"))) == len(project.lines("start"))  # each ran once


def test_a_concurrency_limit_of_two_never_has_three_running(project: Project) -> None:
    total = 60
    project.app.tasks["tasks.limited"].send_many([(i,) for i in range(total)])
    workers = [
        project.popen("worker", "tasks:app", "--pool", "threads", "--concurrency", "4")
        for _ in range(3)
    ]
    try:
        project.wait_for(lambda: len(project.lines("done")) >= total, timeout=90)
    finally:
        _stop_all(project, workers)
    events = sorted(
        [(t, 1) for t, _ in _events(project, "start")]
        + [(t, -1) for t, _ in _events(project, "done")]
    )
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2  # the limit was reached (so it was tested) and never passed
    assert sorted(map(int, project.lines("done"))) == list(range(total))
    assert project.app.broker.dead_letters("default") == []


def test_unique_sends_enqueue_once_until_the_message_is_acknowledged(project: Project) -> None:
    once = project.app.tasks["tasks.once"]
    first = once.send(1, 0)
    assert once.send(1, 0) == first
    assert project.stats()["ready"] == 1
    out = project.hurtle("worker", "tasks:app", "--burst")
    assert out.returncode == 0, out.stderr
    assert project.lines("done") == ["1"]
    second = once.send(1, 0)  # the first was acknowledged: its lock ended with it
    assert second != first
    assert project.stats()["ready"] == 1


def test_a_killed_workers_unique_lock_ends_after_unique_for(project: Project) -> None:
    once = project.app.tasks["tasks.once"]
    worker = project.popen("worker", "tasks:app", HURTLE_HEARTBEAT_TIMEOUT="30")
    once.send(0, 0)  # the worker is up and taking work before the held call is sent, so
    project.wait_for(lambda: "0" in project.lines("done"))  # a slow start does not outlast its lock
    first = once.send(7, 60)
    project.wait_for(lambda: "7" in project.lines("start"))
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    assert once.send(7, 60) == first  # held: the message is still in flight
    deadline = time.monotonic() + 30
    while once.send(7, 60) == first:
        assert time.monotonic() < deadline, "the lock outlived unique_for"
        time.sleep(0.05)
    assert project.stats()["ready"] == 1  # the new one waits; the old one is still held


def test_expired_unique_locks_are_swept_from_redis(redis_url: str) -> None:
    import redis
    from hurtle.brokers import make_broker
    from hurtle.brokers.keys import queue_keys
    from hurtle.ids import new_id
    from hurtle.message import Message

    broker = make_broker(redis_url)
    client = redis.Redis.from_url(redis_url)
    try:

        def one(key: str) -> Message:
            return Message(id=new_id(), task="t", queue="q", headers={"unique": key})

        broker.publish_unique([one(f"k{i}") for i in range(50)], 0.1)
        assert client.hlen(queue_keys("q").unique) == 50
        time.sleep(0.2)  # every lock expired
        deadline = time.monotonic() + 10
        while client.hlen(queue_keys("q").unique) > 1:  # each publish sweeps some
            assert time.monotonic() < deadline, "expired locks stay"
            broker.publish_unique([one("fresh")], 60)
    finally:
        client.close()
        broker.close()
