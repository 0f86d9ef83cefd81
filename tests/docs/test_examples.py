"""Every example of the documentation runs: README.md and each page under docs/.

A page is one story: its Python blocks run in order in one namespace, in a directory of their
own, so a block may use what an earlier one defined. What a reader would have running beside
the code is provided here, never written into the page:

* ``HURTLE_BROKER_URL`` is ``memory://``, so ``Hurtle()`` needs no server; a URL of a local Redis
  in a block (``redis://localhost:6379/0``) is pointed at this session's private redis-server,
  and one of the PostgreSQL database ``shop`` on the local server
  (``postgresql://localhost/shop``, also ``postgresql+psycopg://`` and the like for SQLAlchemy)
  at this session's own database;
* after each block, every ``Hurtle`` app of the namespace that has tasks gets a worker (a thread
  of this process, the ``threads`` pool), started afresh when the block added tasks or queues, so
  ``h.result()`` in a page returns as it would with ``hurtle worker`` running;
* a block that starts with a file name comment (``# tasks.py``, ``# shop/views.py``) is also
  written to that file, and every such file of the page is written before its first block runs,
  as a project has all its files at once: ``hurtle worker tasks:app`` names a module that
  exists, and a module may import one that the page shows later (a Django app's files exist
  when the settings that install it are loaded); a page names each file once;
* top-level ``await`` works, as in ``python -m asyncio``.

After a page, ``os.environ`` is as it was and the modules imported from its directory (packages
without ``__init__.py`` too) are forgotten. A library's own process-wide state is not undone:
Django's settings can be configured once per process, so one page only may configure them.

Shell blocks (``sh``, ``console``) are not run, but each ``hurtle ...`` command in them is parsed
by hurtle's own argument parser: a command or option that does not exist fails the page.

A block preceded by ``<!-- docs-test: skip REASON -->`` is not run; the reason is required.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import shlex
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hurtle import Hurtle
from postgres_server import postgres_database, postgres_server_url  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(
    r"(?P<directive><!-- docs-test: (?P<what>[^>]*?) -->\s*\n)?"
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
    re.M | re.S,
)
FILE_COMMENT = re.compile(r"#\s*([\w/]+\.py)\s*$")
LOCAL_REDIS = re.compile(r"redis://(?:localhost|127\.0\.0\.1)(?::6379)?(?:/0)?")
LOCAL_POSTGRES = re.compile(r"(postgresql(?:\+\w+)?)://localhost/shop\b")


@dataclass
class Block:
    lang: str
    body: str
    line: int
    skip: str | None


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        indent = m["indent"]
        body = "".join(line[len(indent) :] for line in m["body"].splitlines(keepends=True))
        skip = None
        what = (m["what"] or "").strip()
        if what:
            verb, _, reason = what.partition(" ")
            if verb != "skip" or not reason.strip():
                raise ValueError(f"{page}: bad directive {what!r}: use 'skip REASON'")
            skip = reason.strip()
        found.append(Block(m["lang"], body, text.count("\n", 0, m.start("body")) + 1, skip))
    return found


def pages_with_examples() -> list[Path]:
    return [p for p in PAGES if any(b.lang in ("python", "py", "sh", "console") for b in blocks(p))]


def is_app(value: object) -> bool:
    """Whether ``value`` is a ``Hurtle`` app, asked of its type: ``isinstance`` would evaluate a
    lazy object (Django's ``settings`` before they are configured)."""
    return issubclass(type(value), Hurtle)


class Workers:
    """One in-process worker per app of a page, restarted when the app's tasks change."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[Any, Any, threading.Thread, tuple[Any, ...]]] = {}

    def ensure(self, namespace: dict[str, Any]) -> None:
        for app in list(namespace.values()):
            if not is_app(app) or not app.tasks:
                continue
            shape = (tuple(app.tasks), tuple(app.queues()), len(app.schedules))
            current = self.running.get(id(app))
            if current is not None and current[3] == shape:
                continue
            if current is not None:
                self._stop(current)
            worker = app.worker(pool="threads", concurrency=4, shutdown_timeout=5)
            thread = threading.Thread(target=worker.run, daemon=True, name="docs-worker")
            thread.start()
            worker.started.wait(10)
            self.running[id(app)] = (app, worker, thread, shape)

    def _stop(self, entry: tuple[Any, Any, threading.Thread, tuple[Any, ...]]) -> None:
        _, worker, thread, _ = entry
        worker.stop()
        thread.join(15)
        assert not thread.is_alive(), "a documentation example's worker did not stop"

    def close(self) -> None:
        for entry in self.running.values():
            self._stop(entry)


def run_python(block: Block, namespace: dict[str, Any], page: Path, workers: Workers) -> None:
    """Run a block statement by statement, so a worker serves the tasks a statement defined
    before the next one waits on their results."""
    name = f"{page.relative_to(ROOT)}:{block.line}"
    tree = ast.parse(block.body, name)
    for statement in tree.body:
        module = ast.Module(body=[statement], type_ignores=[])
        code = compile(module, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
        workers.ensure(namespace)


def write_files(runnable: list[Block], page: Path, directory: Path) -> None:
    """Write each block that starts with a file name comment to that file, under ``directory``."""
    written: set[str] = set()
    for block in runnable:
        first = block.body.splitlines()[0] if block.body.strip() else ""
        named = FILE_COMMENT.fullmatch(first.strip())
        if not named:
            continue
        name = named.group(1)
        if name in written:
            raise ValueError(f"{page.name}:{block.line}: a second block is named {name}")
        written.add(name)
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.body)


def check_commands(block: Block, page: Path) -> None:
    from hurtle.cli import build_parser

    parser = build_parser()
    for raw in block.body.replace("\\\n", " ").splitlines():
        line = raw.strip().removeprefix("$ ")
        for part in re.split(r"&&|\|\||;", line.split(" #")[0]):
            words = shlex.split(part.strip())
            if words[:3] == ["python3", "-m", "hurtle"] or words[:3] == ["python", "-m", "hurtle"]:
                words = ["hurtle", *words[3:]]
            if not words or words[0] != "hurtle" or any(w in ("[", "|") for w in words):
                continue
            if any(w.startswith("[") or w.endswith("]") or "|" in w for w in words):
                continue  # a usage line (``[--queues a,b]``, ``list|retry``), not a command
            try:
                with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
                    parser.parse_args(words[1:])
            except SystemExit as exit:
                if exit.code not in (0, None):
                    pytest.fail(f"{page.name}:{block.line}: hurtle cannot parse {part.strip()!r}")


@pytest.fixture
def page_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HURTLE_BROKER_URL", "memory://")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    environ = dict(os.environ)
    yield tmp_path
    os.environ.clear()
    os.environ.update(environ)
    forget_modules(before, tmp_path)


def forget_modules(before: set[str], directory: Path) -> None:
    """Drop from ``sys.modules`` what was imported from ``directory`` since ``before``: the
    modules a page wrote (tasks.py) go with it. All are found before any goes: the path of a
    package without ``__init__.py`` cannot be read once its parent package is gone."""
    written = [
        name
        for name in set(sys.modules) - before
        if sys.modules.get(name) is not None and _loaded_from(sys.modules[name], directory)
    ]
    for name in written:
        del sys.modules[name]


def _loaded_from(module: Any, directory: Path) -> bool:
    """Whether ``module`` was imported from ``directory``: its file, or for a package without
    ``__init__.py`` (``__file__`` is None), its path."""
    where = [getattr(module, "__file__", None), *getattr(module, "__path__", ())]
    return any(str(w).startswith(str(directory)) for w in where if w)


@pytest.mark.parametrize("page", pages_with_examples(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_the_page_runs(page: Path, page_env: Path, request: Any) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    workers = Workers()
    redis_url: str | None = None
    postgres_url: str | None = None
    try:
        runnable: list[Block] = []
        for block in blocks(page):
            if block.skip is not None:
                continue
            if block.lang in ("sh", "console", "bash"):
                check_commands(block, page)
                continue
            if block.lang not in ("python", "py"):
                continue
            body = block.body
            if LOCAL_REDIS.search(body):
                if redis_url is None:
                    redis_url = request.getfixturevalue("redis_url")
                body = LOCAL_REDIS.sub(redis_url, body)
            if LOCAL_POSTGRES.search(body):
                if postgres_url is None:
                    postgres_url = str(request.getfixturevalue("postgres_database"))
                body = LOCAL_POSTGRES.sub(rf"\1://{postgres_url.partition('://')[2]}", body)
            runnable.append(Block(block.lang, body, block.line, None))
        write_files(runnable, page, page_env)
        for block in runnable:
            run_python(block, namespace, page, workers)
    finally:
        workers.close()
        for value in namespace.values():
            if is_app(value):
                value.close()


def test_a_page_s_packages_without_init_are_forgotten_with_its_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Django page's ``shop`` (no ``__init__.py``) must not outlive the page: a later page's
    ``shop.tasks`` would be looked up in the first page's directory."""
    (tmp_path / "docs_probe_app" / "management").mkdir(parents=True)
    (tmp_path / "docs_probe_app" / "management" / "command.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    import docs_probe_app.management.command  # noqa: F401

    forget_modules(before, tmp_path)
    assert not any(name.startswith("docs_probe_app") for name in sys.modules)
