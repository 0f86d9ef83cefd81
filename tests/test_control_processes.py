"""Control across processes: a worker process running while its queue is paused (by the CLI, in
another process) does not consume it, and does once the queue is resumed; a cancellation made
by the CLI holds for a worker started afterwards; a purge by the CLI asks first."""

from __future__ import annotations

import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project, run_hurtle_at_a_terminal

TASKS = textwrap.dedent(
    """
    import os

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    def log(tag):
        with open(os.environ["RUNS_LOG"], "a") as f:
            f.write(f"done {tag} {os.getpid()}\\n")


    @app.task(name="tasks.paused", queue="pq", retries=0)
    def paused(tag):
        log(tag)


    @app.task(name="tasks.other", queue="oq", retries=0)
    def other(tag):
        log(tag)


    @app.task(name="tasks.kept", queue="oq", retries=0, store_result=True)
    def kept(tag):
        log(tag)
    """
)


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = str(request.getfixturevalue("redis_url")) if request.param == "redis" else None
    p = Project(tmp_path, TASKS, (), url=url)
    p.app.task(name="tasks.paused", queue="pq", retries=0)(lambda tag: None)
    p.app.task(name="tasks.other", queue="oq", retries=0)(lambda tag: None)
    p.app.task(name="tasks.kept", queue="oq", retries=0)(lambda tag: None)
    yield p
    p.app.close()


def test_a_running_worker_leaves_a_paused_queue_alone_until_it_is_resumed(
    project: Project,
) -> None:
    paused = project.hurtle("queue", "tasks:app", "pause", "pq")
    assert paused.returncode == 0, paused.stderr
    assert project.status()["pq"]["paused"] is True
    worker = project.popen("worker", "tasks:app", "--queues", "pq,oq")
    try:
        project.send_many("tasks.paused", [(f"p{i}",) for i in range(5)])
        project.send("tasks.other", "o1")  # sent after them, from a queue listed after theirs
        project.wait_for(lambda: "o1" in project.lines("done"), timeout=60)
        assert project.lines("done") == ["o1"]
        assert project.status()["pq"]["ready"] == 5
        project.send("tasks.other", "o2")
        project.wait_for(lambda: "o2" in project.lines("done"), timeout=60)
        assert project.lines("done") == ["o1", "o2"]
        resumed = project.hurtle("queue", "tasks:app", "resume", "pq")
        assert resumed.returncode == 0, resumed.stderr
        project.wait_for(lambda: len(project.lines("done")) == 7, timeout=60)
        assert sorted(project.lines("done")[2:]) == [f"p{i}" for i in range(5)]
        assert project.status()["pq"]["paused"] is False
    finally:
        worker.send_signal(signal.SIGTERM)
        assert project.stop(worker) == 0, project.output(worker)


def test_a_cancellation_from_the_cli_holds_for_workers_started_later(project: Project) -> None:
    ids = [project.send("tasks.other", f"o{i}") for i in range(4)]
    out = project.hurtle("cancel", "tasks:app", ids[0], ids[2])
    assert out.returncode == 0, out.stderr
    run = project.hurtle("worker", "tasks:app", "--queues", "oq", "--burst")
    assert run.returncode == 0, run.stderr
    assert sorted(project.lines("done")) == ["o1", "o3"]
    dead = project.app.broker.dead_letters("oq")
    assert sorted(d.reason for d in dead) == ["cancelled", "cancelled"]


@pytest.mark.parametrize("bogus", ["bogus-id", "tasks.other", "ABCDEF0123456789abcdef01", "a" * 23])
def test_cancel_refuses_what_is_no_message_id_in_one_line_and_cancels_nothing(
    project: Project, bogus: str
) -> None:
    good = project.send("tasks.other", "o1")
    out = project.hurtle("cancel", "tasks:app", good, bogus)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    [line] = out.stderr.strip().splitlines()
    assert f"{bogus!r} is not a message id" in line and "nothing was cancelled" in line
    assert project.app.broker.cancelled([good]) == set()


def test_cancel_says_an_id_may_be_unknown_and_reports_a_settled_one(project: Project) -> None:
    done = project.send("tasks.kept", "k1")
    run = project.hurtle("worker", "tasks:app", "--queues", "oq", "--burst")
    assert run.returncode == 0, run.stderr
    waiting = project.send("tasks.other", "o1")
    unsent = "0123456789abcdef01234567"
    out = project.hurtle("cancel", "tasks:app", done, waiting, unsent)
    assert out.returncode == 0, out.stderr
    assert f"{done}: already succeeded, nothing to cancel" in out.stdout
    assert "cancelled 2 message id(s)" in out.stdout
    assert "cannot tell whether one was sent" in out.stdout
    assert "cancelled for when it is" in out.stdout
    assert project.app.broker.cancelled([done, waiting, unsent]) == {waiting, unsent}


def test_queue_purge_asks_first_and_drops_only_the_waiting_messages(project: Project) -> None:
    project.send_many("tasks.paused", [(f"p{i}",) for i in range(3)])
    project.send("tasks.other", "o1")

    def purge(*extra: str, answer: str = "") -> subprocess.CompletedProcess[str]:
        command = ("queue", "tasks:app", "purge", "pq", *extra)
        if extra:
            return project.hurtle(*command)
        return run_hurtle_at_a_terminal(*command, answer=answer, cwd=project.root, **project.env)

    refused = purge(answer="n\n")
    assert refused.returncode == 1, refused.stderr
    assert "3 ready" in refused.stdout and "nothing done" in refused.stdout
    assert project.status()["pq"]["ready"] == 3
    confirmed = purge(answer="y\n")
    assert confirmed.returncode == 0, confirmed.stderr
    assert "3 waiting message(s) dropped" in confirmed.stdout
    assert (project.status()["pq"]["ready"], project.status()["oq"]["ready"]) == (0, 1)
    project.send("tasks.paused", "p3")
    unasked = purge("--yes")
    assert unasked.returncode == 0, unasked.stderr
    assert "1 waiting message(s) dropped" in unasked.stdout
    assert project.status()["pq"]["ready"] == 0
