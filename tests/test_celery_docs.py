"""docs/coming-from-celery.md runs: its Python blocks in order in one namespace, as the page says,
with ``HURTLE_BROKER_URL=memory://`` and a worker in the background for each app once a block
has made it; what the blocks print is what their comments say. And each of Celery's spellings
that hurtle takes has a row of its own in one of the page's tables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hurtle import Hurtle
from hurtle.worker import Worker

PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from-celery.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)

#: What the blocks print, in order (a worker's own prints may come between).
PRINTED = [
    "5",
    "True True False",
    "SUCCESS SUCCESS",
    "succeeded",
    "8",
    "<html of example.org>",
    "ValueError cannot parse 'x'",
    "FAILURE True",
    "TaskFailed",
    "30",
    "30",
    "30",
    "[0, 2, 4, 6]",
    "10",
    "12",
    "4",
    "42",
    "3",
    "task 'tasks.slow': @app.task does not take soft_time_limit=: hurtle has one time limit: "
    "give time_limit=N seconds",
]

#: Celery's spellings that each need a table row.
SPELLINGS = [
    ".get(timeout=10)",
    ".ready()",
    ".successful()",
    ".failed()",
    "result.status",
    "result.state",
    "sig.delay()",
    "sig.apply_async(",
    "add.s(1, 2) \\| mul.s(3)",
    "chain(...)()",
    "chain(...).delay()",
    "group(...)()",
    "chord([...])(total.s())",
    "add.signature(",
    "sig.set(",
    "app.send_task(",
    "app.AsyncResult(id)",
    "max_retries=",
    "autoretry_for=",
    "retry_backoff=",
    "ignore_result=",
    "soft_time_limit=",
    "acks_late=",
    "bind=False",
]


def test_the_page_runs_as_a_story(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HURTLE_BROKER_URL", "memory://")
    namespace: dict[str, Any] = {"__name__": "celery_page"}
    workers: dict[Hurtle, Worker] = {}
    try:
        for n, body in enumerate(BLOCK.findall(PAGE.read_text())):
            exec(compile(body, f"{PAGE.name}:block {n + 1}", "exec"), namespace)
            for value in list(namespace.values()):
                if isinstance(value, Hurtle) and value not in workers:
                    workers[value] = value.worker()
                    workers[value].run_in_thread()
    finally:
        for app, worker in workers.items():
            worker.stop()
            app.close()
    assert len(workers) == 1
    printed = iter(capsys.readouterr().out.splitlines())
    for expected in PRINTED:  # in order, each the start of a line
        assert any(line.startswith(expected) for line in printed), expected


def test_each_celery_spelling_has_a_row_in_the_page() -> None:
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    missing = [s for s in SPELLINGS if not any(s in row.split(" | ")[0] for row in rows)]
    assert missing == []
