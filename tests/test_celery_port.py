"""A Celery module moved over unchanged but for its import lines and the app's line: a
``hurtle worker`` process runs its tasks from the module's file, and this process sends them with
the module's own code (``.delay``, ``.apply_async``, canvas, ``.get``, ``send_task``...).

The worker and the sender share an SQLite broker; nothing here waits on time, only on results.
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from helpers import Project
from hurtle import TaskFailed

#: The module as its Celery version reads, but for the lines marked "ported".
CELERY_MODULE = """\
import os

from hurtle import Hurtle, chain, chord, group  # ported: from celery import Celery, chain, ...

app = Hurtle(os.environ["HURTLE_BROKER_URL"], store_results=True)  # ported: Celery(...)


class Flaky(Exception):
    pass


def note(line):
    with open(os.environ["RUNS_LOG"], "a") as log:
        log.write(line + "\\n")
    with open(os.environ["RUNS_LOG"]) as log:
        return log.read().count(line)


@app.task(bind=False, max_retries=3, acks_late=True)
def add(x, y):
    return x + y


@app.task
def mul(x, y):
    return x * y


@app.task
def tsum(numbers):
    return sum(numbers)


@app.task(max_retries=3, autoretry_for=(Flaky,), retry_backoff=True)
def flaky(key):
    if note(f"flaky {key}") == 1:
        raise Flaky("the first attempt fails")
    return "recovered"


@app.task(autoretry_for=(Flaky,))
def fragile():
    note("fragile")
    raise KeyError("not retried: not in autoretry_for")


@app.task(ignore_result=True)
def audit(line):
    note(f"audit {line}")


def main():
    results = {}
    r = add.delay(2, 3)
    results["delay"] = r.get(timeout=10)
    results["read"] = (r.ready(), r.successful(), r.failed(), r.status, r.state)
    results["countdown"] = add.apply_async((4, 4), countdown=1).get(timeout=10)
    results["chain"] = chain(add.s(1, 2), mul.s(10))().get(timeout=10)
    results["pipe"] = (add.s(1, 1) | mul.s(5) | add.s(100)).delay().get(timeout=10)
    results["group"] = group(add.s(i, i) for i in range(4))().get(timeout=10)
    results["chord"] = chord([add.s(i, 1) for i in range(4)])(tsum.s()).get(timeout=10)
    sent = app.send_task("tasks.add", args=(20, 22), kwargs={})
    results["send_task"] = app.AsyncResult(sent.id).get(timeout=10)
    results["retried"] = flaky.delay("k").get(timeout=30)
    failing = fragile.delay()
    try:
        failing.get(timeout=10)
    except Exception as exc:
        results["failed"] = (type(exc).__name__, failing.status, failing.failed())
    audit.delay("done")
    return results
"""


@pytest.fixture
def tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Project, ModuleType]]:
    """The module written to a project directory and imported here, as its sender would."""
    project = Project(tmp_path, CELERY_MODULE, [])
    for name, value in project.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tasks", raising=False)
    module = importlib.import_module("tasks")
    yield project, module
    module.app.close()
    project.app.close()
    sys.modules.pop("tasks", None)


def test_a_celery_module_runs_unchanged_but_for_its_imports_and_app_line(
    tasks: tuple[Project, ModuleType],
) -> None:
    project, module = tasks
    worker = project.popen("worker", "tasks:app")
    try:
        assert module.add.delay(0, 0).get(timeout=60) == 0  # the worker is up
        results = module.main()
        project.wait_for(lambda: "audit done" in project.runs())
    finally:
        worker.send_signal(signal.SIGTERM)
        assert project.stop(worker) == 0, project.output(worker)
    assert results == {
        "delay": 5,
        "read": (True, True, False, "SUCCESS", "SUCCESS"),
        "countdown": 8,
        "chain": 30,
        "pipe": 110,
        "group": [0, 2, 4, 6],
        "chord": 10,
        "send_task": 42,
        "retried": "recovered",
        "failed": (TaskFailed.__name__, "FAILURE", True),
    }
    # autoretry_for: Flaky was retried once; the KeyError was not retried at all
    assert project.runs() == ["flaky k", "flaky k", "fragile", "audit done"]
