"""Every example of the documentation runs: README.md and each page under docs/.

A page is one story: its Python blocks run in order in one namespace, in a directory of their
own, so a block may use what an earlier one defined. What a reader would have running beside
the code is provided here, never written into the page:

* ``HURTLE_BROKER_URL`` is ``memory://``, so ``Hurtle()`` needs no server; a URL of a local Redis
  in a block (``redis://localhost:6379/0``) is pointed at this session's private redis-server;
* after each block, every ``Hurtle`` app of the namespace that has tasks gets a worker (a thread
  of this process, the ``threads`` pool), started afresh when the block added tasks or queues, so
  ``h.result()`` in a page returns as it would with ``hurtle worker`` running;
* a block that starts with a file name comment (``# tasks.py``) is also written to that file, so
  a later ``hurtle worker tasks:app`` in the page names a module that exists;
* top-level ``await`` works, as in ``python -m asyncio``.

Shell blocks (``sh``, ``console``) are not run, but each ``hurtle ...`` command in them is parsed
by hurtle's own argument parser: a command or option that does not exist fails the page.

A block preceded by ``<!-- docs-test: skip REASON -->`` is not run; the reason is required.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
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

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(
    r"(?P<directive><!-- docs-test: (?P<what>[^>]*?) -->\s*\n)?"
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
    re.M | re.S,
)
FILE_COMMENT = re.compile(r"#\s*([\w/]+\.py)\s*$")
LOCAL_REDIS = re.compile(r"redis://(?:localhost|127\.0\.0\.1)(?::6379)?(?:/0)?")


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


class Workers:
    """One in-process worker per app of a page, restarted when the app's tasks change."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[Any, Any, threading.Thread, tuple[Any, ...]]] = {}

    def ensure(self, namespace: dict[str, Any]) -> None:
        for app in list(namespace.values()):
            if not isinstance(app, Hurtle) or not app.tasks:
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
    yield tmp_path
    for name in set(sys.modules) - before:  # modules the page wrote (tasks.py) go with it
        module = sys.modules.get(name)
        if module is not None and str(getattr(module, "__file__", "")).startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.mark.parametrize("page", pages_with_examples(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_the_page_runs(page: Path, page_env: Path, request: Any) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    workers = Workers()
    redis_url: str | None = None
    try:
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
            first = body.splitlines()[0] if body.strip() else ""
            named = FILE_COMMENT.fullmatch(first.strip())
            if named:
                target = page_env / named.group(1)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(body)
            run_python(Block(block.lang, body, block.line, None), namespace, page, workers)
    finally:
        workers.close()
        for value in namespace.values():
            if isinstance(value, Hurtle):
                value.close()
