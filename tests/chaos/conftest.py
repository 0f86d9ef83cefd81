"""Fixtures of the chaos tests: a project per trial on SQLite, Redis or PostgreSQL (a schema of
its own per trial), and its fleet of workers.

At the end of a session that ran chaos trials, a table of their figures is printed (what
docs/reliability.md records).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_support import RESULTS, TASK_NAMES, TASKS, TRIALS, Fleet

from helpers import Project
from postgres_server import (  # noqa: F401 - fixtures
    postgres_database,
    postgres_private,
    postgres_server_url,
    postgres_url,
)

#: The fixture that gives each broker's URL (SQLite: none, a file in the trial's directory).
URL_FIXTURES = {"sqlite": None, "redis": "redis_url", "postgres": "postgres_url"}


@pytest.fixture(params=list(URL_FIXTURES))
def broker(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def project(broker: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    fixture = URL_FIXTURES[broker]
    url = None if fixture is None else str(request.getfixturevalue(fixture))
    p = Project(tmp_path, TASKS, TASK_NAMES, url)
    yield p
    p.app.close()


@pytest.fixture
def fleet(project: Project) -> Iterator[Fleet]:
    f = Fleet(project)
    yield f
    f.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    rows: dict[tuple[str, str], list[int]] = {}
    for t in RESULTS:
        row = rows.setdefault((t.broker, t.scenario), [0, 0, 0, 0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += t.expected
        row[2] += len(t.lost)
        row[3] += t.duplicates
        row[4] = max(row[4], t.duplicates)
        row[5] = max(row[5], t.max_duplicates + 1)
        row[6] += len(t.pending)
        row[7] += len(t.blamed)
    tr = terminalreporter
    tr.section(f"chaos trials (HURTLE_CHAOS_TRIALS={TRIALS})")
    tr.write_line(
        "| broker | scenario | trials | tasks | lost | duplicates | "
        "max duplicates in a trial | most runs of one task | pending | innocents blamed |"
    )
    tr.write_line("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (broker, scenario), row in sorted(rows.items()):
        tr.write_line(f"| {broker} | {scenario} | " + " | ".join(map(str, row)) + " |")
