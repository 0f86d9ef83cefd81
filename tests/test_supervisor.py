"""``hurtle worker --processes P``: a supervisor of P real worker processes, on SQLite."""

from __future__ import annotations

import collections
import os
import signal

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
    assert project.stats() == {"ready": 40 - len(finished), "delayed": 0, "in_flight": 0,
                               "dead": 0}


def test_burst_with_processes_runs_everything_once_and_exits_0(
    project: Project,  # noqa: F811
) -> None:
    project.send_many("w.nap", [(i, 0.002) for i in range(300)])
    result = project.hurtle("worker", "tasks:app", "--processes", "2", "--pool", "threads",
                            "--concurrency", "8", "--burst")
    assert result.returncode == 0, result.stderr
    assert collections.Counter(project.lines("done")) == collections.Counter(
        str(i) for i in range(300))
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}


def test_a_killed_process_is_replaced_and_its_tasks_run_elsewhere(
    project: Project,  # noqa: F811
) -> None:
    total = 200
    project.send_many("w.nap", [(i, 0.02) for i in range(total)])
    supervisor = project.popen("worker", "tasks:app", "--processes", "2",
                               HURTLE_HEARTBEAT_TIMEOUT="1")
    project.wait_for(lambda: len(project.pids()) == 2)
    victim = int(sorted(project.pids())[0])
    os.kill(victim, signal.SIGKILL)
    project.wait_for(lambda: len(project.pids()) == 3)  # a fresh process took its place
    project.wait_for(lambda: set(project.lines("done")) == {str(i) for i in range(total)},
                     timeout=60)
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
    result = project.hurtle("worker", "tasks:app", "--processes", "1", "--pool", "threads",
                            "--burst", timeout=60)
    assert result.returncode == 0, result.stderr
    assert project.lines("start") == ["stuck", "stuck"]  # the first attempt and its retry
    assert len(project.pids()) == 2  # each in its own process: the first was replaced
    assert "asked to be replaced" in result.stderr
    (dead,) = project.app.broker.dead_letters("default")
    assert "TimeLimitExceeded" in dead.reason
