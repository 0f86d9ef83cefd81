"""Every pool in a real ``hurtle worker`` process on the embedded SQLite broker: all tasks run
exactly once at concurrency 500, SIGTERM lets running tasks finish and hands back the rest, a
second signal hands back the running ones too, and greenlet pools patch only when launched."""

from __future__ import annotations

import collections
import importlib.util
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Project, hurtle_env

TASKS = textwrap.dedent(
    """
    import asyncio
    import os
    import time

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line} {os.getpid()}\\n")


    @app.task(name="w.nap", retries=0)
    def nap(i, seconds):
        record(f"start {i}")
        time.sleep(seconds)
        record(f"done {i}")


    @app.task(name="w.anap", retries=0)
    async def anap(i, seconds):
        record(f"start {i}")
        await asyncio.sleep(seconds)
        record(f"done {i}")


    @app.task(name="w.together", retries=0)
    async def together(i, n):
        # waits (up to 5 s) until all n calls have started: they can only all see one another
        # if they run at the same time
        record(f"start {i}")
        for _ in range(500):
            with open(LOG) as f:
                if sum(line.startswith("start ") for line in f) >= n:
                    record(f"done {i}")
                    return
            await asyncio.sleep(0.01)
        record(f"alone {i}")


    @app.task(name="w.limited", retries=1, retry_delay=0.01, time_limit=0.5)
    def limited(i, seconds):
        record(f"start {i}")
        time.sleep(seconds)
        record(f"done {i}")


    @app.task(name="w.alimited", retries=0, time_limit=0.5)
    async def alimited(i, seconds):
        record(f"start {i}")
        await asyncio.sleep(seconds)
        record(f"done {i}")
    """
)

TASK_NAMES = ("w.nap", "w.anap", "w.limited", "w.alimited", "w.together")
GREENLET_POOLS = ("gevent", "eventlet")
ALL_POOLS = ("solo", "threads", "asyncio", *GREENLET_POOLS)


def needs(pool: str) -> object:
    """A pytest param for ``pool`` that skips when its optional package is missing."""
    missing = pool in GREENLET_POOLS and importlib.util.find_spec(pool) is None
    return pytest.param(pool, marks=pytest.mark.skipif(missing, reason=f"{pool} is not installed"))


def pools(*names: str) -> list[object]:
    return [needs(p) for p in names]


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, TASK_NAMES)
    yield p
    p.app.close()


def task_for(pool: str) -> str:
    """The natural task of a pool: ``async def`` for asyncio, plain ``def`` for the others."""
    return "w.anap" if pool == "asyncio" else "w.nap"


@pytest.mark.parametrize("pool", pools("threads", "asyncio", *GREENLET_POOLS))
def test_pool_at_concurrency_500_runs_2000_tasks_exactly_once(project: Project, pool: str) -> None:
    total = 2000
    project.send_many(task_for(pool), [(i, 0.01) for i in range(total)])
    result = project.hurtle(
        "worker", "tasks:app", "--pool", pool, "--concurrency", "500", "--burst", timeout=120
    )
    assert result.returncode == 0, result.stderr
    done = collections.Counter(project.lines("done"))
    assert done == collections.Counter(str(i) for i in range(total))  # each exactly once
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


@pytest.mark.parametrize("pool", pools("threads", "asyncio", *GREENLET_POOLS))
def test_pool_at_concurrency_500_on_redis_runs_2000_tasks_exactly_once(
    tmp_path: Path, redis_url: str, pool: str
) -> None:
    project = Project(tmp_path, TASKS, TASK_NAMES, redis_url)
    total = 2000
    project.send_many(task_for(pool), [(i, 0.01) for i in range(total)])
    result = project.hurtle(
        "worker", "tasks:app", "--pool", pool, "--concurrency", "500", "--burst", timeout=120
    )
    project.app.close()
    assert result.returncode == 0, result.stderr
    assert collections.Counter(project.lines("done")) == collections.Counter(
        str(i) for i in range(total)
    )
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


@pytest.mark.parametrize("pool", pools(*GREENLET_POOLS))
def test_async_def_task_still_runs_in_a_greenlet_pool(project: Project, pool: str) -> None:
    project.send_many("w.anap", [(i, 0.01) for i in range(20)])
    result = project.hurtle("worker", "tasks:app", "--pool", pool, "--burst")
    assert result.returncode == 0, result.stderr
    assert sorted(project.lines("done"), key=int) == [str(i) for i in range(20)]


@pytest.mark.parametrize("pool", pools("threads", "asyncio", *GREENLET_POOLS))
def test_async_def_tasks_run_at_the_same_time_in_every_concurrent_pool(
    project: Project, pool: str
) -> None:
    n = 8
    project.send_many("w.together", [(i, n) for i in range(n)])
    result = project.hurtle("worker", "tasks:app", "--pool", pool, "-c", str(n), "--burst")
    assert result.returncode == 0, result.stderr
    assert project.lines("alone") == []
    assert sorted(project.lines("done"), key=int) == [str(i) for i in range(n)]


@pytest.mark.parametrize("pool", pools("asyncio", *GREENLET_POOLS))
def test_sigterm_lets_running_tasks_finish_and_hands_back_the_rest(
    project: Project, pool: str
) -> None:
    project.send_many(task_for(pool), [(i, 0.5) for i in range(30)])
    worker = project.popen("worker", "tasks:app", "--pool", pool, "--concurrency", "4")
    project.wait_for(lambda: len(project.lines("start")) >= 4)
    worker.send_signal(signal.SIGTERM)
    assert project.stop(worker) == 0, project.output(worker)
    started, finished = project.lines("start"), project.lines("done")
    assert sorted(started) == sorted(finished)  # nothing was cut short
    assert project.stats() == {"ready": 30 - len(finished), "delayed": 0, "in_flight": 0, "dead": 0}


@pytest.mark.parametrize("pool", pools(*ALL_POOLS))
def test_second_sigterm_hands_back_running_tasks_and_exits_at_once(
    project: Project, pool: str
) -> None:
    project.send_many(task_for(pool), [(i, 60.0) for i in range(10)])
    worker = project.popen("worker", "tasks:app", "--pool", pool, "--concurrency", "2")
    project.wait_for(lambda: len(project.lines("start")) >= 1)
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # let the first signal be handled on its own
    worker.send_signal(signal.SIGTERM)
    assert project.stop(worker, timeout=20) == 0, project.output(worker)  # tasks take 60 s
    assert project.lines("done") == []
    assert project.stats() == {"ready": 10, "delayed": 0, "in_flight": 0, "dead": 0}


def test_importing_hurtle_patches_nothing() -> None:
    code = textwrap.dedent(
        """
        import importlib.util, socket, threading
        original = (socket.socket, threading.Lock, threading.Thread)
        import hurtle, hurtle.cli, hurtle.worker, hurtle.worker.executors.greenlets
        from hurtle.worker.executors import make_executor
        assert (socket.socket, threading.Lock, threading.Thread) == original
        if importlib.util.find_spec("gevent"):
            import gevent.monkey
            assert not gevent.monkey.is_module_patched("socket")
            assert not gevent.monkey.is_module_patched("threading")
        if importlib.util.find_spec("eventlet"):
            import warnings
            warnings.simplefilter("ignore")
            import eventlet.patcher
            assert not eventlet.patcher.is_monkey_patched("socket")
            assert not eventlet.patcher.is_monkey_patched("thread")
        print("unpatched")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=hurtle_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "unpatched"


@pytest.mark.parametrize("pool", GREENLET_POOLS)
def test_missing_greenlet_package_is_a_one_line_error_exiting_2(
    project: Project, pool: str, tmp_path: Path
) -> None:
    shadow = tmp_path / "shadow" / pool
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ImportError('No module named {pool}')\n")
    result = project.hurtle(
        "worker",
        "tasks:app",
        "--pool",
        pool,
        PYTHONPATH=f"{tmp_path / 'shadow'}:{hurtle_env()['PYTHONPATH']}",
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"hurtle: error: the {pool} pool needs the {pool} package")
    assert f"pip install 'hurtle[{pool}]'" in lines[0]
