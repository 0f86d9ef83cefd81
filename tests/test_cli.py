"""The ``hurtle`` command in real subprocesses, on the embedded SQLite broker."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT, Project, free_port, hurtle_env, run_hurtle

TASKS = textwrap.dedent(
    """
    import os
    import time

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line}\\n")


    @app.task(name="tasks.add")
    def add(x, y):
        record(f"add {x} {y}")
        return x + y


    @app.task(name="tasks.slow", retries=0)
    def slow(i, seconds):
        record(f"start {i}")
        time.sleep(seconds)
        record(f"done {i}")


    @app.task(name="tasks.broken", retries=1, retry_delay=0.01)
    def broken():
        record("broken")
        raise ValueError("always broken")
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    p = Project(tmp_path, TASKS, ("tasks.add", "tasks.slow", "tasks.broken"))
    yield p  # type: ignore[misc]
    p.app.close()


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_worker_for_a_missing_module_says_so_in_one_line_and_exits_2(project: Project) -> None:
    line = _one_line_error(project.hurtle("worker", "nosuchmodule:app"))
    assert "nosuchmodule" in line and line.startswith("hurtle: error:")


def test_worker_for_a_missing_attribute_says_so_in_one_line_and_exits_2(project: Project) -> None:
    line = _one_line_error(project.hurtle("worker", "tasks:nope"))
    assert "no attribute 'nope'" in line


def test_bad_broker_url_says_so_in_one_line_and_exits_2(project: Project) -> None:
    for command in (["worker", "tasks:app"], ["status", "tasks:app"]):
        line = _one_line_error(project.hurtle(*command, HURTLE_BROKER_URL="kafka://nowhere"))
        assert "unsupported broker URL 'kafka://nowhere'" in line


def test_burst_worker_runs_everything_and_status_json_reports_the_counts(project: Project) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(300)])
    project.send("tasks.broken")
    result = project.hurtle("worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    runs = project.runs()
    assert sorted(r for r in runs if r.startswith("add")) == sorted(
        f"add {i} 1" for i in range(300)
    )
    assert runs.count("broken") == 2  # the first attempt and one retry
    assert project.status()["default"] == {
        "ready": 0,
        "delayed": 0,
        "in_flight": 0,
        "dead": 1,
        "paused": False,
    }


def test_status_lists_queues_in_a_table(project: Project) -> None:
    project.app.tasks["tasks.add"].options(queue="emails").send(1, 2)
    project.app.tasks["tasks.add"].options(delay=600).send(1, 2)
    out = project.hurtle("status", "tasks:app")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[2:]}
    assert rows == {"default": ["0", "1", "0", "0"], "emails": ["1", "0", "0", "0"]}


def test_dead_letters_can_be_listed_retried_and_purged(project: Project) -> None:
    project.send("tasks.broken")
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    listed = project.hurtle("dead", "tasks:app", "list")
    assert listed.returncode == 0 and "tasks.broken" in listed.stdout
    assert "ValueError: always broken" in listed.stdout
    as_json = json.loads(project.hurtle("dead", "tasks:app", "list", "--json").stdout)
    assert [d["task"] for d in as_json] == ["tasks.broken"]

    retried = project.hurtle("dead", "tasks:app", "retry")
    assert "put back 1 dead letters" in retried.stdout
    assert project.status()["default"]["ready"] == 1
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    assert project.runs().count("broken") == 4  # a fresh budget: two more attempts

    purged = project.hurtle("dead", "tasks:app", "purge", "--yes")
    assert "purged 1 dead letters" in purged.stdout
    assert project.status()["default"]["dead"] == 0


def test_demo_runs_on_the_embedded_default_and_reports_tasks_per_second(tmp_path: Path) -> None:
    result = run_hurtle("demo", "--count", "3000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "published 3,000 tasks" in result.stdout
    assert "consumed  3,000 tasks" in result.stdout
    assert "3,000 correct sums, 0 dead letters" in result.stdout
    assert "tasks/s" in result.stdout
    assert not (tmp_path / "hurtle.db").exists()  # the demo leaves nothing behind


def test_on_a_terminal_no_log_line_of_the_demo_shares_its_progress_bars_line(
    tmp_path: Path,
) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hurtle", "demo", "--count", "3000"],
        cwd=tmp_path,
        env=hurtle_env(),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed (EIO)
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(60) == 0, out
    lines = out.decode().split("\r\n")  # the terminal ends lines with CR LF
    logged = [line for line in lines if " INFO hurtle." in line]
    assert any("stopped after 3000 tasks" in line for line in logged), lines
    for line in logged:  # what stays on screen of it: what follows its last carriage return
        shown = line.rsplit("\r", 1)[-1].removeprefix("\x1b[K")  # (erased to the line's end)
        assert re.match(r"\d{4}-\d\d-\d\d \S+ INFO hurtle\.", shown), lines
    last = max(i for i, line in enumerate(lines) if " INFO hurtle." in line)
    assert lines[last + 1].lstrip("\r").startswith("consume  ["), lines  # the bar, below them
    assert " ok in " not in out.decode()  # the demo reports its calls as a whole


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_sigterm_lets_the_running_task_finish_and_hands_back_the_rest(
    project: Project, pool: str
) -> None:
    project.app.tasks["tasks.slow"].send_many([(i, 0.5) for i in range(10)])
    worker = project.popen("worker", "tasks:app", "--pool", pool, "--concurrency", "1")
    project.wait_for(lambda: any(r.startswith("start") for r in project.runs()))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, project.output(worker)
    runs = project.runs()
    started = [r.split()[1] for r in runs if r.startswith("start")]
    finished = [r.split()[1] for r in runs if r.startswith("done")]
    assert started == finished  # nothing was cut short
    assert project.status()["default"] == {
        "ready": 10 - len(finished),
        "delayed": 0,
        "in_flight": 0,
        "dead": 0,
        "paused": False,
    }


# -- edges: settings, flags, optional packages, the demo and the README example --------------


def test_version_prints_the_package_version() -> None:
    from hurtle import __version__

    result = run_hurtle("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"hurtle {__version__}"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_a_bad_setting_is_one_line_for_commands_and_never_breaks_help(
    project: Project, value: str
) -> None:
    bad = {"HURTLE_HEARTBEAT_TIMEOUT": value}
    for command in (["--help"], ["worker", "--help"], ["bench", "--help"]):
        result = project.hurtle(*command, **bad)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr and "usage: hurtle" in result.stdout
    for command in (["worker", "tasks:app", "--burst"], ["status", "tasks:app"]):
        line = _one_line_error(project.hurtle(*command, **bad))
        assert f"HURTLE_HEARTBEAT_TIMEOUT='{value}'" in line


def test_log_level_works_after_the_subcommand_and_debug_logs_one_line_per_batch(
    project: Project,
) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(5)])
    result = project.hurtle("worker", "tasks:app", "--burst", "--log-level", "debug")
    assert result.returncode == 0, result.stderr
    batches = [line for line in result.stderr.splitlines() if "DEBUG" in line and "fetched" in line]
    assert batches and "tasks.add x5" in batches[0], result.stderr
    quiet = project.hurtle("--log-level", "WARNING", "worker", "tasks:app", "--burst")
    assert quiet.returncode == 0 and "INFO" not in quiet.stderr, quiet.stderr
    after = project.hurtle("status", "tasks:app", "--log-level", "ERROR")
    assert after.returncode == 0, after.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_unknown_log_level_is_refused(project: Project, where: str) -> None:
    flag = ["--log-level", "bogus"]
    command = ["status", "tasks:app"]
    result = project.hurtle(*(flag + command if where == "before" else command + flag))
    assert result.returncode == 2
    assert "invalid level 'bogus'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "soon"])
def test_a_bad_shutdown_timeout_is_refused(project: Project, value: str) -> None:
    result = project.hurtle("worker", "tasks:app", "--burst", f"--shutdown-timeout={value}")
    assert result.returncode == 2
    assert "--shutdown-timeout" in result.stderr and "finite number of seconds >= 0" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_concurrency_with_the_solo_pool_warns_that_it_runs_one_task_at_a_time(
    project: Project,
) -> None:
    result = project.hurtle("worker", "tasks:app", "--burst", "--concurrency", "4")
    assert result.returncode == 0, result.stderr
    assert "--concurrency 4 is ignored: the solo pool runs one task at a time" in result.stderr


def test_the_worker_logs_its_tasks_and_the_absolute_path_of_its_sqlite_file(
    project: Project,
) -> None:
    result = project.hurtle(
        "worker", "tasks:app", "--burst", HURTLE_BROKER_URL="sqlite:///relative.db"
    )
    assert result.returncode == 0, result.stderr
    assert "3 tasks (tasks.add, tasks.broken, tasks.slow)" in result.stderr
    assert f"broker file {project.root.resolve() / 'relative.db'}" in result.stderr


def test_a_sqlite_url_in_a_missing_directory_is_one_line_and_creates_nothing(
    project: Project, tmp_path: Path
) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    url = f"sqlite:///{missing / 'x.db'}"
    for command in (["worker", "tasks:app", "--burst"], ["status", "tasks:app"]):
        line = _one_line_error(project.hurtle(*command, HURTLE_BROKER_URL=url))
        assert f"no directory '{missing}'" in line
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("scheme", "reason", "hint"),
    [
        ("redis", "Connection refused", "is redis-server running there?"),
        ("nats", "Connect call failed", "is nats-server running there"),
    ],
)
def test_status_on_a_server_nobody_listens_at_is_one_line_with_the_reason_and_a_hint(
    project: Project, scheme: str, reason: str, hint: str
) -> None:
    pytest.importorskip(scheme)
    url = f"{scheme}://127.0.0.1:{free_port()}"  # nothing listens there
    for command in (["status", "tasks:app"], ["dead", "tasks:app", "list"]):
        line = _one_line_error(project.hurtle(*command, HURTLE_BROKER_URL=url))
        assert line.startswith("hurtle: error: cannot ")
        assert url in line and reason in line and hint in line, line


def test_a_burst_worker_gives_up_on_an_unreachable_broker_with_exit_2(project: Project) -> None:
    pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    result = project.hurtle(
        "worker",
        "tasks:app",
        "--burst",
        timeout=120,
        HURTLE_BROKER_URL=url,
        HURTLE_UNREACHABLE_TIMEOUT="1",
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hurtle: error: burst: the broker") and "unreachable" in last
    assert "Traceback" not in result.stderr


def test_bench_without_the_redis_package_is_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "redis.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'redis'\", name='redis')\n"
    )
    for kind in ("tasks", "io"):
        result = run_hurtle(
            "bench", kind, "--count", "10", cwd=tmp_path, PYTHONPATH=f"{fake}:{ROOT / 'src'}"
        )
        line = _one_line_error(result)
        assert "needs the redis package" in line and "pip install 'hurtle[redis]'" in line


def test_demo_on_a_users_broker_touches_none_of_the_users_messages(redis_url: str) -> None:
    from hurtle import Hurtle

    app = Hurtle(redis_url)
    user_task = app.task(name="user.job")(lambda: None)
    user_task.send_many([()] * 5)
    consumer = app.broker.consumer(["default"])
    (held,) = consumer.fetch(1, 0)
    consumer.dead_letter(held, "the user's own dead letter")
    consumer.close()
    before = app.broker.stats(["default"])["default"]
    queues_before = set(app.broker.queues())

    result = run_hurtle("demo", "--count", "2000", "--broker", redis_url)
    assert result.returncode == 0, result.stderr
    assert "2,000 correct sums, 0 dead letters" in result.stdout
    assert app.broker.stats(["default"])["default"] == before
    (dead,) = app.broker.dead_letters("default")
    assert dead.reason == "the user's own dead letter"
    new = set(app.broker.queues()) - queues_before
    assert len(new) == 1 and next(iter(new)).startswith("hurtle-demo-")
    stats = app.broker.stats(new)[next(iter(new))]
    assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
    app.close()


def _readme_block(language: str, after: str) -> str:
    """A block of the first example of docs/tasks.md (the guide README points to)."""
    text = (ROOT / "docs" / "tasks.md").read_text()
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start : text.index("```", start)]


def test_the_guide_example_sends_only_when_run_and_its_worker_consumes_its_queues(
    tmp_path: Path,
) -> None:
    source = _readme_block("python", "# Tasks and sending")
    assert source.startswith("# tasks.py")
    p = Project(tmp_path, source, ())
    for _ in range(2):  # importing it (status, worker) sends nothing
        assert all(sum(q.values()) == 0 for q in p.status().values())
    ran = subprocess.run(
        [sys.executable, "tasks.py"],
        cwd=tmp_path,
        env=hurtle_env(**p.env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    used = {name for name, q in p.status().items() if sum(q.values())}
    assert used == {"default", "slow"}
    command = _readme_block("sh", source.splitlines()[-1])
    queues = command.split("--queues", 1)[1].split()[0].split(",")
    assert used <= set(queues), command
    p.app.close()
