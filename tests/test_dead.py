"""``hurtle dead`` in real subprocesses: listing with message ids, retrying and purging by id,
and the per-queue limits of dead letters set through the environment."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures

TASKS = textwrap.dedent(
    """
    import os

    from hurtle import Hurtle, Reject

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="tasks.refuse")
    def refuse(n, tag=None):
        with open(os.environ["RUNS_LOG"], "a") as f:
            f.write(f"refuse {n}\\n")
        raise Reject(f"refused {n}")


    @app.task(name="tasks.crash", retries=0)
    def crash():
        raise ValueError("crashed")
    """
)


@pytest.fixture(params=["sqlite"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = (
        str(request.getfixturevalue(f"{request.param}_url"))
        if request.param in ("redis", "nats")
        else None
    )
    p = Project(tmp_path, TASKS, ("tasks.refuse", "tasks.crash"), url=url)
    yield p
    p.app.close()


def dead_letters_of(project: Project, *refused: int) -> list[str]:
    """Send ``refuse(n)`` for each n, run a burst worker; the message ids, in order."""
    ids = [project.send("tasks.refuse", n) for n in refused]
    done = project.hurtle("worker", "tasks:app", "--burst")
    assert done.returncode == 0, done.stderr
    assert project.stats()["dead"] == len(refused)
    return ids


def listed(project: Project) -> list[dict[str, object]]:
    out = project.hurtle("dead", "tasks:app", "list", "--json")
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def test_list_shows_each_dead_letters_task_and_message_id(project: Project) -> None:
    [message_id] = dead_letters_of(project, 7)
    out = project.hurtle("dead", "tasks:app", "list")
    assert out.returncode == 0, out.stderr
    [row] = listed(project)
    first_line = out.stdout.splitlines()[0]
    assert first_line.startswith(f"{row['id']}  default  ")
    assert f"tasks.refuse(7)  message {message_id}" in first_line
    assert "refused 7" in out.stdout
    assert (row["message_id"], row["task"], row["args"], row["kwargs"]) == (
        message_id,
        "tasks.refuse",
        [7],
        {},
    )


def test_retry_by_message_id_puts_back_only_that_message(project: Project) -> None:
    ids = dead_letters_of(project, 1, 2, 3)
    out = project.hurtle("dead", "tasks:app", "retry", ids[1])
    assert (out.returncode, out.stdout.strip()) == (0, "put back 1 dead letters"), out.stderr
    assert [r["message_id"] for r in listed(project)] == [ids[0], ids[2]]
    assert project.stats()["ready"] == 1
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    assert project.runs() == ["refuse 1", "refuse 2", "refuse 3", "refuse 2"]


def test_purge_by_dead_letter_id_removes_only_those(project: Project) -> None:
    ids = dead_letters_of(project, 1, 2, 3)
    rows = listed(project)
    out = project.hurtle(
        "dead", "tasks:app", "purge", str(rows[0]["id"]), str(rows[2]["id"]), "--yes"
    )
    assert (out.returncode, out.stdout.strip()) == (0, "purged 2 dead letters"), out.stderr
    assert [r["message_id"] for r in listed(project)] == [ids[1]]
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 1}


def test_an_id_that_names_no_dead_letter_is_reported_and_the_others_are_handled(
    project: Project,
) -> None:
    ids = dead_letters_of(project, 1, 2)
    out = project.hurtle("dead", "tasks:app", "purge", "no-such-id", ids[0], "--yes")
    assert out.returncode == 1
    assert "purged 1 dead letters" in out.stdout
    assert "'no-such-id'" in out.stderr and "Traceback" not in out.stderr
    assert [r["message_id"] for r in listed(project)] == [ids[1]]
    nothing = project.hurtle("dead", "tasks:app", "retry", "no-such-id")
    assert nothing.returncode == 1 and "put back 0 dead letters" in nothing.stdout
    assert project.stats()["dead"] == 1


@pytest.mark.parametrize("project", ["redis", "nats"], indirect=True)
def test_retry_and_purge_by_id_on_the_other_brokers(project: Project) -> None:
    ids = dead_letters_of(project, 1, 2, 3)
    rows = listed(project)
    assert [r["message_id"] for r in rows] == ids
    assert all(re.fullmatch("[0-9a-f]{24}", str(r["id"])) for r in rows), rows  # as elsewhere
    retried = project.hurtle("dead", "tasks:app", "retry", ids[0])
    assert (retried.returncode, retried.stdout.strip()) == (0, "put back 1 dead letters")
    purged = project.hurtle("dead", "tasks:app", "purge", str(rows[1]["id"]), "--yes")
    assert (purged.returncode, purged.stdout.strip()) == (0, "purged 1 dead letters")
    assert [r["message_id"] for r in listed(project)] == [ids[2]]
    assert project.stats()["ready"] == 1


@pytest.mark.parametrize("project", ["sqlite", "redis", "nats"], indirect=True)
def test_a_dead_letters_traceback_keeps_its_lines_in_list_and_json(project: Project) -> None:
    message_id = project.send("tasks.crash")
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    [row] = listed(project)
    reason = str(row["reason"])
    assert row["message_id"] == message_id
    assert "\nTraceback (most recent call last):\n" in reason, reason
    assert reason.rstrip().endswith("ValueError: crashed"), reason
    out = project.hurtle("dead", "tasks:app", "list")
    assert out.returncode == 0, out.stderr
    # the list shows a reason's first and last lines
    assert out.stdout.splitlines()[1].strip().endswith("... ValueError: crashed"), out.stdout


def test_a_worker_keeps_at_most_dead_letter_max_per_queue_and_warns(project: Project) -> None:
    ids = [project.send("tasks.refuse", n) for n in range(4)]
    done = project.hurtle("worker", "tasks:app", "--burst", HURTLE_DEAD_LETTER_MAX="2")
    assert done.returncode == 0, done.stderr
    assert [r["message_id"] for r in listed(project)] == ids[2:]
    assert "dropped the 1 oldest dead letters of queue 'default'" in done.stderr
    assert "dead_letter_max (2)" in done.stderr


def test_list_says_how_many_more_a_queue_holds_beyond_the_limit(project: Project) -> None:
    dead_letters_of(project, 1, 2, 3)
    out = project.hurtle("dead", "tasks:app", "list", "--limit", "1")
    assert out.returncode == 0, out.stderr
    assert "... and 2 more in 'default'" in out.stdout
    assert out.stdout.count("tasks.refuse(") == 1
