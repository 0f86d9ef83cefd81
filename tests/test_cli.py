"""The ``hurtle`` command in real subprocesses, on the embedded SQLite broker."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers import Project, run_hurtle

TASKS = textwrap.dedent(
    """
    import os
    import time

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line}\\n")


    @app.task(name="tasks.add")
    def add(x, y):
        record(f"add {x} {y}")
        return x + y


    @app.task(name="tasks.slow", retries=0)
    def slow(i, seconds):
        record(f"start {i}")
        time.sleep(seconds)
        record(f"done {i}")


    @app.task(name="tasks.broken", retries=1, retry_delay=0.01)
    def broken():
        record("broken")
        raise ValueError("always broken")
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    p = Project(tmp_path, TASKS, ("tasks.add", "tasks.slow", "tasks.broken"))
    yield p  # type: ignore[misc]
    p.app.close()


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_worker_for_a_missing_module_says_so_in_one_line_and_exits_2(project: Project) -> None:
    line = _one_line_error(project.hurtle("worker", "nosuchmodule:app"))
    assert "nosuchmodule" in line and line.startswith("hurtle: error:")


def test_worker_for_a_missing_attribute_says_so_in_one_line_and_exits_2(project: Project) -> None:
    line = _one_line_error(project.hurtle("worker", "tasks:nope"))
    assert "no attribute 'nope'" in line


def test_bad_broker_url_says_so_in_one_line_and_exits_2(project: Project) -> None:
    for command in (["worker", "tasks:app"], ["status", "tasks:app"]):
        line = _one_line_error(project.hurtle(*command, HURTLE_BROKER_URL="kafka://nowhere"))
        assert "unsupported broker URL 'kafka://nowhere'" in line


def test_burst_worker_runs_everything_and_status_json_reports_the_counts(project: Project) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(300)])
    project.send("tasks.broken")
    result = project.hurtle("worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    runs = project.runs()
    assert sorted(r for r in runs if r.startswith("add")) == sorted(
        f"add {i} 1" for i in range(300)
    )
    assert runs.count("broken") == 2  # the first attempt and one retry
    assert project.status()["default"] == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 1}


def test_status_lists_queues_in_a_table(project: Project) -> None:
    project.app.tasks["tasks.add"].options(queue="emails").send(1, 2)
    project.app.tasks["tasks.add"].options(delay=600).send(1, 2)
    out = project.hurtle("status", "tasks:app")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[2:]}
    assert rows == {"default": ["0", "1", "0", "0"], "emails": ["1", "0", "0", "0"]}


def test_dead_letters_can_be_listed_retried_and_purged(project: Project) -> None:
    project.send("tasks.broken")
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    listed = project.hurtle("dead", "tasks:app", "list")
    assert listed.returncode == 0 and "tasks.broken" in listed.stdout
    assert "ValueError: always broken" in listed.stdout
    as_json = json.loads(project.hurtle("dead", "tasks:app", "list", "--json").stdout)
    assert [d["task"] for d in as_json] == ["tasks.broken"]

    retried = project.hurtle("dead", "tasks:app", "retry")
    assert "put back 1 dead letters" in retried.stdout
    assert project.status()["default"]["ready"] == 1
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    assert project.runs().count("broken") == 4  # a fresh budget: two more attempts

    purged = project.hurtle("dead", "tasks:app", "purge")
    assert "purged 1 dead letters" in purged.stdout
    assert project.status()["default"]["dead"] == 0


def test_demo_runs_on_the_embedded_default_and_reports_tasks_per_second(tmp_path: Path) -> None:
    result = run_hurtle("demo", "--count", "3000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "published 3,000 tasks" in result.stdout
    assert "consumed  3,000 tasks" in result.stdout
    assert "3,000 correct sums, 0 dead letters" in result.stdout
    assert "tasks/s" in result.stdout
    assert not (tmp_path / "hurtle.db").exists()  # the demo leaves nothing behind


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_sigterm_lets_the_running_task_finish_and_hands_back_the_rest(
    project: Project, pool: str
) -> None:
    project.app.tasks["tasks.slow"].send_many([(i, 0.5) for i in range(10)])
    worker = project.popen("worker", "tasks:app", "--pool", pool, "--concurrency", "1")
    project.wait_for(lambda: any(r.startswith("start") for r in project.runs()))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, project.output(worker)
    runs = project.runs()
    started = [r.split()[1] for r in runs if r.startswith("start")]
    finished = [r.split()[1] for r in runs if r.startswith("done")]
    assert started == finished  # nothing was cut short
    assert project.status()["default"] == {
        "ready": 10 - len(finished), "delayed": 0, "in_flight": 0, "dead": 0
    }
