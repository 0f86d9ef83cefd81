"""Queue and task names: one rule (``hurtle.names``), checked at every entry point, on the
memory broker and through the ``hurtle`` command; nothing is sent when a name is refused."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import Project
from hurtle import ConfigurationError, Hurtle
from hurtle.brokers.common import check_queue_name
from hurtle.names import MAX_QUEUE_NAME, MAX_TASK_NAME

BAD_QUEUES: list[Any] = [
    5,
    b"bytes",
    "",
    "a b",
    "}x",
    "{x}",
    "orders.*",
    "orders.>",
    "tab\there",
    "é",
    "a/b",
    "x" * (MAX_QUEUE_NAME + 1),
]
GOOD_QUEUES = ["a", "default", "reports.daily", "tenant:42", "a_b-c.d:e", "x" * MAX_QUEUE_NAME]


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://")


def _nothing_sent(app: Hurtle) -> None:
    assert app.broker.queues() == [] or all(
        s.ready == s.delayed == 0 for s in app.broker.stats().values()
    )


def _entry_points(app: Hurtle) -> dict[str, Callable[[Any], object]]:
    @app.task(name="t")
    def t() -> None: ...

    return {
        "@app.task(queue=)": lambda q: app.task(name="other", queue=q)(lambda: None),
        ".options(queue=)": lambda q: t.options(queue=q).send(),
        ".s().options(queue=)": lambda q: t.s().options(queue=q).send(),
        "apply_async(queue=)": lambda q: t.apply_async(queue=q),
        "Hurtle(default_queue=)": lambda q: Hurtle("memory://", default_queue=q),
        "app.worker(queues=)": lambda q: app.worker(queues=[q]),
        "app.pause": app.pause,
        "app.resume": app.resume,
        "broker.purge": app.broker.purge,
        "check_queue_name": check_queue_name,
    }


@pytest.mark.parametrize("queue", BAD_QUEUES, ids=repr)
def test_a_bad_queue_name_is_refused_at_every_entry_point_and_nothing_is_sent(
    app: Hurtle, queue: Any
) -> None:
    for where, enter in _entry_points(app).items():
        with pytest.raises(ConfigurationError, match="queue name") as caught:
            enter(queue)
        assert "1 to 100 characters of A-Z a-z 0-9 . _ : -" in str(caught.value), where
    _nothing_sent(app)
    assert "other" not in app.tasks


@pytest.mark.parametrize("queue", GOOD_QUEUES)
def test_a_queue_name_of_the_documented_alphabet_is_taken_everywhere(
    app: Hurtle, queue: str
) -> None:
    for enter in _entry_points(app).values():
        enter(queue)


def test_a_queue_given_as_one_string_is_refused_rather_than_split_into_letters(
    app: Hurtle,
) -> None:
    with pytest.raises(ConfigurationError, match=r"queues=\['emails'\]"):
        app.worker(queues="emails")


def test_a_task_name_longer_than_the_limit_is_refused(app: Hurtle) -> None:
    app.task(name="n" * MAX_TASK_NAME)(lambda: None)
    for bad in ["n" * (MAX_TASK_NAME + 1), "n" * 1_000_000, "", 5]:
        with pytest.raises(ConfigurationError, match="task name"):
            app.task(name=bad)(lambda: None)
    assert list(app.tasks) == ["n" * MAX_TASK_NAME]


TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()

    @app.task(name="tasks.noop")
    def noop():
        pass
    """
)


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "tasks:app", "pause", "a b"),
        ("queue", "tasks:app", "resume", "}x"),
        ("queue", "tasks:app", "purge", "x" * 101, "--yes"),
        ("worker", "tasks:app", "--burst", "--queues", "default,{x}"),
    ],
    ids=["pause", "resume", "purge", "worker"],
)
def test_the_cli_refuses_a_bad_queue_name_in_one_line(tmp_path: Path, args: tuple[str]) -> None:
    project = Project(tmp_path, TASKS, ("tasks.noop",))
    try:
        line = _one_line_error(project.hurtle(*args))
        assert "queue name" in line and "A-Z a-z 0-9 . _ : -" in line
        assert project.app.broker.paused() == set()
    finally:
        project.app.close()
