"""``hurtle worker APP --watch``: a real watcher process whose worker child is restarted when the
app's module is edited, with ``watchfiles`` and with the standard-library poller."""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from helpers import ROOT, Project
from hurtle.cli.watch import poll, python_files

TASKS = textwrap.dedent(
    """
    import os

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="tasks.hello")
    def hello(x):
        with open(os.environ["RUNS_LOG"], "a") as f:
            f.write(f"{VERSION} {x}\\n")


    VERSION = "v1"
    """
)


def _edit(path: Path, text: str) -> None:
    """Rewrite ``path``; each version has a size of its own (a cached bytecode file is keyed
    on the source's mtime in whole seconds, and its size: an edit within the same second of
    the same size would import the old code)."""
    assert len(text) != path.stat().st_size
    path.write_text(text)


@pytest.mark.parametrize("backend", ["watchfiles", "poller"])
def test_watch_restarts_the_worker_with_the_edited_code(tmp_path: Path, backend: str) -> None:
    env: dict[str, str] = {}
    if backend == "watchfiles":
        pytest.importorskip("watchfiles")
    else:  # as if watchfiles were not installed
        fake = tmp_path / "site"
        fake.mkdir()
        (fake / "watchfiles.py").write_text(
            "raise ModuleNotFoundError(\"No module named 'watchfiles'\", name='watchfiles')\n"
        )
        env["PYTHONPATH"] = f"{fake}:{ROOT / 'src'}"
    root = tmp_path / "project"
    root.mkdir()
    project = Project(root, TASKS, ("tasks.hello",))
    proc = project.popen("worker", "tasks:app", "--watch", **env)
    try:

        def started(n: int) -> bool:
            return project.output(proc).count("consuming default") >= n

        project.wait_for(lambda: started(1), 60)
        project.send("tasks.hello", 1)
        project.wait_for(lambda: "v1 1" in project.runs())
        _edit(root / "tasks.py", TASKS.replace('VERSION = "v1"', 'VERSION = "v2, edited"'))
        project.wait_for(lambda: started(2), 60)
        project.send("tasks.hello", 2)
        project.wait_for(lambda: "v2, edited 2" in project.runs())
        # a module that cannot be imported: the worker exits, and starts again once fixed
        _edit(root / "tasks.py", TASKS + "\nthis is not python\n")
        project.wait_for(lambda: "it starts again when a file changes" in project.output(proc))
        _edit(root / "tasks.py", TASKS.replace('VERSION = "v1"', 'VERSION = "v3, fixed!"'))
        project.wait_for(lambda: started(3), 60)
        project.send("tasks.hello", 3)
        project.wait_for(lambda: "v3, fixed! 3" in project.runs())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = project.stop(proc)
        project.app.close()
    out = project.output(proc)
    assert code == 0, out
    assert "tasks.py changed: restarting the worker" in out
    assert ("(watchfiles)" in out) == (backend == "watchfiles"), out
    assert ("looking every 0.5 s" in out) == (backend == "poller"), out
    # two restarts stopped their worker gracefully, and the watcher's stop the last one
    assert out.count("stopped after") == 3, out
    assert "watchfiles.main" not in out  # its own line per change says it
    assert project.runs() == ["v1 1", "v2, edited 2", "v3, fixed! 3"]


def test_watch_refuses_a_path_that_does_not_exist(tmp_path: Path) -> None:
    project = Project(tmp_path, TASKS, ("tasks.hello",))
    try:
        result = project.hurtle("worker", "tasks:app", "--watch", "no/such/dir")
    finally:
        project.app.close()
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("hurtle: error: --watch 'no/such/dir': no such file or directory")


def test_the_poller_sees_files_added_changed_and_removed_and_skips_caches(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.py").write_text("")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "b.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert list(python_files(tmp_path)) == [str(tmp_path / "a.py")]
    stop = threading.Event()
    seen: list[set[str]] = []

    def watch() -> None:
        for changed in poll(tmp_path, every=0.02)(stop):
            seen.append(changed)

    thread = threading.Thread(target=watch)
    thread.start()
    deadline = time.monotonic() + 10
    try:
        n = 1
        while not seen:  # edited until seen: the poller's first look may come after an edit
            assert time.monotonic() < deadline
            n += 1
            (tmp_path / "a.py").write_text("a = 1\n" * n)
            time.sleep(0.01)
        (tmp_path / "b.py").write_text("")
        (tmp_path / "a.py").unlink()
        while set().union(*seen) != {str(tmp_path / "a.py"), str(tmp_path / "b.py")}:
            assert time.monotonic() < deadline, seen
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
