"""``hurtle worker --processes P``: a supervisor of P real worker processes, on SQLite."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import hurtle_env
from hurtle.worker.supervisor import Supervisor
from test_executors_processes import Project, project  # noqa: F401 - the fixture


def test_processes_share_the_queue_and_stop_cleanly_on_sigterm(
    project: Project,  # noqa: F811
) -> None:
    project.send_many("w.nap", [(i, 0.3) for i in range(40)])
    supervisor = project.popen("worker", "tasks:app", "--processes", "2")
    project.wait_for(lambda: len(project.pids()) == 2)  # two processes run tasks at once
    supervisor.send_signal(signal.SIGTERM)
    assert project.stop(supervisor) == 0, project.output(supervisor)
    started, finished = project.lines("start"), project.lines("done")
    assert sorted(started) == sorted(finished)  # running tasks finished
    assert project.stats() == {"ready": 40 - len(finished), "delayed": 0, "in_flight": 0, "dead": 0}


def test_burst_with_processes_runs_everything_once_and_exits_0(
    project: Project,  # noqa: F811
) -> None:
    project.send_many("w.nap", [(i, 0.002) for i in range(300)])
    result = project.hurtle(
        "worker",
        "tasks:app",
        "--processes",
        "2",
        "--pool",
        "threads",
        "--concurrency",
        "8",
        "--burst",
    )
    assert result.returncode == 0, result.stderr
    assert collections.Counter(project.lines("done")) == collections.Counter(
        str(i) for i in range(300)
    )
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


def test_a_killed_process_is_replaced_and_its_tasks_run_elsewhere(
    project: Project,  # noqa: F811
) -> None:
    total = 200
    project.send_many("w.nap", [(i, 0.02) for i in range(total)])
    supervisor = project.popen(
        "worker", "tasks:app", "--processes", "2", HURTLE_HEARTBEAT_TIMEOUT="1"
    )
    project.wait_for(lambda: len(project.pids()) == 2)
    victim = int(sorted(project.pids())[0])
    os.kill(victim, signal.SIGKILL)
    project.wait_for(lambda: len(project.pids()) == 3)  # a fresh process took its place
    project.wait_for(
        lambda: set(project.lines("done")) == {str(i) for i in range(total)}, timeout=60
    )
    supervisor.send_signal(signal.SIGTERM)
    assert project.stop(supervisor) == 0, project.output(supervisor)
    assert "died (signal SIGKILL): starting another" in project.output(supervisor)
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


def test_a_configuration_error_in_the_processes_stops_the_supervisor_with_2(
    project: Project,  # noqa: F811
) -> None:
    result = project.hurtle("worker", "nosuchmodule:app", "--processes", "2")
    assert result.returncode == 2, result.stderr
    assert "cannot import 'nosuchmodule'" in result.stderr


def test_a_process_with_an_abandoned_thread_is_replaced(
    project: Project,  # noqa: F811
) -> None:
    project.send_many("w.limited", [("stuck", 60.0)])
    result = project.hurtle(
        "worker", "tasks:app", "--processes", "1", "--pool", "threads", "--burst", timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert project.lines("start") == ["stuck", "stuck"]  # the first attempt and its retry
    assert len(project.pids()) == 2  # each in its own process: the first was replaced
    assert "asked to be replaced" in result.stderr
    (dead,) = project.app.broker.dead_letters("default")
    assert "TimeLimitExceeded" in dead.reason


@pytest.mark.parametrize("started", [1, 4])
def test_sigterm_while_the_supervisor_starts_its_processes_exits_0_every_time(
    project: Project,  # noqa: F811
    started: int,
) -> None:
    # The children are still importing when the signal comes: some not started yet, some
    # without their signal handlers yet. Every trial must end promptly and cleanly.
    for _ in range(4):
        supervisor = project.popen("worker", "tasks:app", "--processes", "4")
        project.wait_for(
            lambda s=supervisor: f"started worker process {started} " in project.output(s)
        )
        supervisor.send_signal(signal.SIGTERM)
        assert project.stop(supervisor) == 0, project.output(supervisor)
        assert "stopped with" not in project.output(supervisor)


class _SignalledWhileSpawning(Supervisor):
    """A supervisor that receives SIGTERM in the middle of its ``n``-th start of a process."""

    def __init__(self, n: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n = n
        self.spawns = 0

    def _popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        self.spawns += 1
        if self.spawns == self.n:
            signal.raise_signal(signal.SIGTERM)  # handled right here, before the process exists
        return super()._popen(argv)


@pytest.fixture
def main_thread_signals() -> Iterator[None]:
    """Run a supervisor on the test's main thread, with its handlers, and restore them after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _run_with_a_guard(supervisor: Supervisor) -> int:
    """``supervisor.run()``; if it hangs, kill its processes (making it return) and fail."""
    hung = threading.Event()

    def guard() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if finished.is_set():
                return
            time.sleep(0.05)
        hung.set()
        supervisor.stop()  # stopping from now on: what it kills is not restarted
        while not finished.wait(0.1):
            for child in supervisor.children:
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()

    finished = threading.Event()
    threading.Thread(target=guard, daemon=True).start()
    try:
        code = supervisor.run()
    finally:
        finished.set()
    assert not hung.is_set(), "the supervisor hung: a process started after SIGTERM kept running"
    return code


@pytest.mark.parametrize("n", [1, 2])
def test_sigterm_during_the_start_of_a_process_stops_that_process_too(
    project: Project,  # noqa: F811
    main_thread_signals: None,
    n: int,
) -> None:
    supervisor = _SignalledWhileSpawning(
        n,
        ["worker", "tasks:app"],
        2,
        env=hurtle_env(
            **project.env, PYTHONPATH=str(project.root) + os.pathsep + hurtle_env()["PYTHONPATH"]
        ),
    )
    supervisor.install_signal_handlers()
    assert _run_with_a_guard(supervisor) == 0
    assert supervisor.spawns == n  # none started once the supervisor was stopping


def test_sigterm_during_the_restart_of_a_process_stops_the_new_process(
    project: Project,  # noqa: F811
    main_thread_signals: None,
) -> None:
    project.send_many("w.nap", [(i, 60.0) for i in range(2)])
    supervisor = _SignalledWhileSpawning(
        3,
        ["worker", "tasks:app"],
        2,
        env=hurtle_env(
            **project.env, PYTHONPATH=str(project.root) + os.pathsep + hurtle_env()["PYTHONPATH"]
        ),
    )
    supervisor.install_signal_handlers()

    def kill_one_when_busy() -> None:  # the supervisor then restarts it: the third start
        project.wait_for(lambda: len(project.pids()) >= 1)
        os.kill(int(sorted(project.pids())[0]), signal.SIGKILL)

    threading.Thread(target=kill_one_when_busy, daemon=True).start()
    assert _run_with_a_guard(supervisor) == 0
    assert supervisor.spawns == 3
