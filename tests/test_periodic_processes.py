"""Periodic tasks across real worker processes: three schedulers enqueue each tick once, on Redis
and on SQLite, even when one of them is killed; ``hurtle schedule list``; ``--no-scheduler``."""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from helpers import Project
from hurtle import Hurtle

# The task logs the tick of each message it runs (from the header the scheduler sets), with the
# message id: a tick enqueued twice shows as two ids. A middleware reads the header; the app
# adds it to every worker the CLI makes.
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


@app.periodic(every=float(os.environ.get("EVERY", "1.0")))
@app.task(retries=0)
def beat():
    pass


@app.task
def report(day, full=False):
    pass


app.periodic(report, cron="30 2 * * *", tz="Europe/Paris", args=("mon",), name="nightly",
             catch_up=False)
"""


def ticks(project: Project) -> dict[float, set[str]]:
    """Tick -> the ids of the messages that ran for it."""
    out: dict[float, set[str]] = defaultdict(set)
    for line in project.runs():
        word, tick, mid, _ = line.split()
        assert word == "tick"
        out[float(tick)].add(mid)
    return out


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Project:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    return Project(tmp_path, TASKS, [], url=url)


@pytest.mark.timeout(180)
def test_three_worker_processes_enqueue_each_tick_exactly_once(project: Project) -> None:
    """Three ``hurtle worker --pool solo`` run an ``every=1.0`` schedule for ~10 s; one of them
    is SIGKILLed midway. Each tick in the window runs from exactly one message, with no gap."""
    env = {"HURTLE_HEARTBEAT_TIMEOUT": "2"}  # the killed worker's message is recovered soon
    workers = [project.popen("worker", "tasks:app", "--pool", "solo", **env) for _ in range(3)]
    try:
        project.wait_for(lambda: all("scheduler:" in project.output(w) for w in workers), 60)

        def span() -> float:
            seen = ticks(project)
            return max(seen) - min(seen) if seen else 0.0

        project.wait_for(lambda: span() >= 4.0, 60)
        workers[0].send_signal(signal.SIGKILL)
        project.wait_for(lambda: span() >= 10.0, 60)
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers[1:]:
            project.stop(w)
        workers[0].wait(30)
    # what the stopped workers handed back (or the killed one held) runs now, without scheduling
    drain = project.hurtle("worker", "tasks:app", "--burst", "--no-scheduler", **env)
    assert drain.returncode == 0, drain.stderr
    seen = ticks(project)
    twice = {t: ids for t, ids in seen.items() if len(ids) > 1}
    assert twice == {}, f"ticks enqueued more than once: {twice}"
    first, last = min(seen), max(seen)
    expected = [first + i for i in range(round(last - first) + 1)]
    assert sorted(seen) == expected, f"gaps: {sorted(set(expected) - set(seen))}"
    assert last - first >= 10.0
    # every tick claimed was enqueued and ran: the broker's last tick is the last one run
    assert project.app.broker.last_tick("default", "tasks.beat") == last
    claims = [project.output(w).count("schedule tasks.beat: enqueued tick") for w in workers]
    assert sum(claims) == len(seen), claims


def claim_old_tick(project: Project, tick: float) -> None:
    """Record ``tick`` of ``tasks.beat`` as claimed (and enqueue it), as a worker would have."""
    app = Hurtle(project.url)
    s = app.periodic(app.task(name="tasks.beat")(lambda: None), every=60)
    assert app.broker.claim_tick(s.queue, s.name, tick, [s.message(tick)]).won
    app.close()


def last_runs(project: Project) -> dict[str, float | None]:
    out = project.hurtle("schedule", "tasks:app", "list", "--json", EVERY="60")
    assert out.returncode == 0, out.stderr
    return {r["name"]: r["last_run"] for r in json.loads(out.stdout)["schedules"]}


def test_schedule_list_shows_last_and_next_runs(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, [])
    out = project.hurtle("schedule", "tasks:app", "list", "--json", EVERY="60")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = {r["name"]: r for r in doc["schedules"]}
    assert set(rows) == {"tasks.beat", "nightly"}
    beat, nightly = rows["tasks.beat"], rows["nightly"]
    assert (beat["every"], beat["cron"], beat["last_run"], beat["queue"]) == (
        60.0,
        None,
        None,
        "default",
    )
    assert beat["next_run"] % 60 == 0 and 0 < beat["next_run"] - doc["time"] <= 60
    assert (nightly["cron"], nightly["tz"], nightly["catch_up"], nightly["task"]) == (
        "30 2 * * *",
        "Europe/Paris",
        False,
        "tasks.report",
    )
    # a worker (in burst mode) catches up the tick missed since the last recorded one
    claim_old_tick(project, 60.0)
    run = project.hurtle("worker", "tasks:app", "--burst", EVERY="60")
    assert run.returncode == 0, run.stderr
    last = last_runs(project)
    assert last["nightly"] is None
    caught_up = last["tasks.beat"]
    assert caught_up is not None and caught_up % 60 == 0 and caught_up > time.time() - 120
    assert sorted(ticks(project)) == [60.0, caught_up]
    text = project.hurtle("schedule", "tasks:app", "list", EVERY="60")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1].split()[:4] == ["schedule", "task", "when", "last"]
    assert any(
        line.startswith("nightly ") and "never" in line and "cron '30 2 * * *' Europe/Paris" in line
        for line in lines
    )
    assert any(
        line.startswith("tasks.beat ") and "every 60s" in line and "UTC" in line for line in lines
    )


def test_a_worker_with_no_scheduler_leaves_a_missed_tick_alone(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, [])
    claim_old_tick(project, 60.0)
    run = project.hurtle("worker", "tasks:app", "--burst", "--no-scheduler", EVERY="60")
    assert run.returncode == 0, run.stderr
    assert sorted(ticks(project)) == [60.0]  # the tick enqueued above ran; none was caught up
    assert last_runs(project)["tasks.beat"] == 60.0


def test_a_supervisor_passes_no_scheduler_to_its_workers(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, [])
    proc = project.popen("worker", "tasks:app", "--processes", "2", "--no-scheduler", EVERY="0.2")
    try:
        project.wait_for(lambda: project.output(proc).count("consuming default") >= 2, 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        project.stop(proc)
    # a worker that schedules says so before it starts consuming
    assert "scheduler:" not in project.output(proc)
    assert ticks(project) == {}


def test_schedule_list_of_an_app_without_schedules_says_so(tmp_path: Path) -> None:
    project = Project(tmp_path, "from hurtle import Hurtle\napp = Hurtle()\n", [])
    text = project.hurtle("schedule", "tasks:app", "list")
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip().splitlines()[-1] == "tasks:app has no periodic tasks (app.periodic)"
    doc = project.hurtle("schedule", "tasks:app", "list", "--json")
    assert json.loads(doc.stdout)["schedules"] == []
