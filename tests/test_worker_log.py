"""What a worker says it ran: a line per call at a low rate, summaries under load, every call
with ``--log-tasks``, JSON lines, a ``--log-config`` file. Real ``hurtle worker`` subprocesses
on the embedded SQLite broker, but for the switching rule, checked on a ``CallLog`` alone."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import textwrap
from pathlib import Path

import pytest

from helpers import Project
from hurtle.brokers.reports import Tally
from hurtle.worker.log import BURST, LINES_PER_SECOND, CallLog, duration, short_repr

TASKS = textwrap.dedent(
    """
    import os

    from hurtle import Hurtle, Reject

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line}\\n")


    @app.task(name="tasks.add")
    def add(x, y):
        return x + y


    @app.task(name="tasks.kept", store_result=True)
    def kept(x):
        return {"x": x, "long": "y" * 500}


    @app.task(name="tasks.limited", rate_limit="100000/s")
    def limited(x):
        return x


    @app.task(name="tasks.quiet")
    def quiet():
        record("quiet")


    @app.task(name="tasks.broken", retries=1, retry_delay=0.01)
    def broken():
        raise ValueError("always broken")


    @app.task(name="tasks.refused")
    def refused():
        raise Reject("not this one")
    """
)
NAMES = ("tasks.add", "tasks.kept", "tasks.limited", "tasks.quiet", "tasks.broken", "tasks.refused")
POOLS = ["solo", "threads", "asyncio"] + [
    p for p in ("gevent",) if importlib.util.find_spec(p) is not None
]


@pytest.fixture
def project(tmp_path: Path) -> Project:
    p = Project(tmp_path, TASKS, NAMES)
    yield p  # type: ignore[misc]
    p.app.close()


def _ok_lines(stderr: str, task: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.search(rf" {task}\[\w+\] ok in ", line)]


@pytest.mark.parametrize("pool", POOLS)
def test_at_a_low_rate_the_worker_logs_each_call_with_its_id_time_and_outcome(
    project: Project, pool: str
) -> None:
    add = project.app.tasks["tasks.add"]
    ids = [h.id for h in add.send_many([(i, 10) for i in range(3)])]
    kept = project.app.tasks["tasks.kept"].send(7).id
    limited = project.app.tasks["tasks.limited"].send(5).id
    quiet = project.send("tasks.quiet")
    broken = project.send("tasks.broken")
    refused = project.send("tasks.refused")
    result = project.hurtle("worker", "tasks:app", "--burst", "--pool", pool)
    assert result.returncode == 0, result.stderr
    err = result.stderr
    for i, id_ in enumerate(ids):  # the result's repr after the run time
        assert re.search(
            rf"INFO hurtle\.worker\.log: tasks\.add\[{id_}\] ok in [\d.]+ ms: {i + 10}\n", err
        ), err
    [line] = [x for x in err.splitlines() if f"tasks.kept[{kept}] ok in" in x]
    assert line.endswith("...") and len(line.split(": ", 2)[2]) <= 60  # a short repr
    assert f"tasks.limited[{limited}] ok in" in err  # middleware with batch hooks
    assert re.search(rf"tasks\.quiet\[{quiet}\] ok in [\d.]+ ms\n", err)  # None: no result shown
    assert re.search(
        rf"WARNING hurtle\.worker\.log: tasks\.broken\[{broken}\] failed in [\d.]+ ms: "
        r"ValueError: always broken \(retry 1 of 1 in [\d.]+ ms\)",
        err,
    ), err
    assert re.search(
        rf"ERROR hurtle\.worker\.log: tasks\.broken\[{broken}\] failed in [\d.]+ ms: "
        r"ValueError: always broken; dead-lettered \(attempt 2 of 2, no retries left\)",
        err,
    ), err
    assert f"tasks.refused[{refused}] rejected in " in err and "not this one; dead-lettered" in err
    assert "summary" not in err and "last " not in err


def test_under_load_the_worker_logs_a_summary_instead_of_a_line_per_call(
    project: Project,
) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(3000)])
    project.app.tasks["tasks.broken"].send_many([() for _ in range(5)])
    result = project.hurtle("worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    err = result.stderr
    one_by_one = len(_ok_lines(err, "tasks.add"))
    assert one_by_one <= BURST, err
    assert "more than 10 calls a second: logging a summary every 10 s" in err
    # the last summary, at the stop, counts what was not logged one by one
    [summary] = [line for line in err.splitlines() if "hurtle.worker.log: last " in line]
    calls = int(re.search(r"last [\d.]+ s: ([\d,]+) calls", summary)[1].replace(",", ""))  # type: ignore[index]
    assert re.search(r"tasks\.add [\d,]+ ok", summary), summary
    added = int(re.search(r"tasks\.add ([\d,]+) ok", summary)[1].replace(",", ""))  # type: ignore[index]
    assert one_by_one + added == 3000
    assert "tasks.broken 10 (5 retried, 5 dead)" in summary, summary
    assert calls == added + 10
    # failures keep their own lines all the same
    assert err.count("ValueError: always broken (retry 1 of 1") == 5


def test_log_tasks_logs_every_call_however_many(project: Project) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(2000)])
    result = project.hurtle("worker", "tasks:app", "--burst", "--log-tasks")
    assert result.returncode == 0, result.stderr
    assert len(_ok_lines(result.stderr, "tasks.add")) == 2000
    assert "summary" not in result.stderr and "hurtle.worker.log: last " not in result.stderr


def test_a_busy_worker_logs_a_summary_every_interval(project: Project) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(3000)])
    proc = project.popen("worker", "tasks:app", "--log-interval", "0.5")
    try:
        project.wait_for(lambda: "hurtle.worker.log: last " in project.output(proc), 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert project.stop(proc) == 0
    out = project.output(proc)
    # logged by the running worker, before it was asked to stop
    assert out.index("hurtle.worker.log: last ") < out.index("SIGTERM received")


def test_log_format_json_writes_one_object_per_line_with_the_call_fields(
    project: Project,
) -> None:
    add = project.app.tasks["tasks.add"].send(2, 3).id
    broken = project.send("tasks.broken")
    result = project.hurtle("--log-format", "json", "worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    [ok] = [r for r in records if r.get("id") == add]
    assert ok["logger"] == "hurtle.worker.log" and ok["level"] == "INFO"
    assert ok["task"] == "tasks.add" and ok["queue"] == "default" and ok["outcome"] == "ok"
    assert ok["result"] == "5" and ok["attempt"] == 1 and ok["runtime"] >= 0
    assert ok["message"].startswith(f"tasks.add[{add}] ok in ")
    failed = [r for r in records if r.get("id") == broken]
    assert [(r["outcome"], r["level"]) for r in failed] == [
        ("retry", "WARNING"),
        ("dead", "ERROR"),
    ]
    assert failed[0]["error"] == "ValueError: always broken" and failed[0]["retry_in"] >= 0


def test_a_json_summary_carries_its_counts_per_task(project: Project) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(3000)])
    result = project.hurtle("worker", "tasks:app", "--burst", "--log-format=json")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]
    [summary] = [r for r in records if "tasks" in r and "interval" in r]
    [row] = summary["tasks"]
    assert row["task"] == "tasks.add" and row["ok"] == row["calls"] == summary["calls"]
    assert summary["calls"] + sum(r.get("task") == "tasks.add" for r in records) == 3000


def test_a_supervisor_passes_the_logging_options_to_its_worker_processes(
    project: Project,
) -> None:
    project.app.tasks["tasks.add"].send_many([(i, 1) for i in range(300)])
    result = project.hurtle(
        "worker", "tasks:app", "--burst", "--processes", "2", "--log-tasks", "--log-format", "json"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]  # all JSON
    assert {r["logger"] for r in records} >= {"hurtle.worker.supervisor", "hurtle.worker.log"}
    assert sum(r.get("task") == "tasks.add" for r in records) == 300  # every call


def test_log_config_sets_up_logging_from_a_dict_config_file(
    project: Project, tmp_path: Path
) -> None:
    add = project.app.tasks["tasks.add"].send(2, 3).id
    broken = project.send("tasks.broken")
    log_file = tmp_path / "worker.log"
    config = {
        "version": 1,
        "formatters": {"short": {"format": "CUSTOM %(levelname)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_file),
                "formatter": "short",
            }
        },
        "loggers": {"hurtle.worker.log": {"level": "WARNING"}},  # no line per call
        "root": {"level": "INFO", "handlers": ["file"]},
    }
    (tmp_path / "logging.json").write_text(json.dumps(config))
    result = project.hurtle("worker", "tasks:app", "--burst", "--log-config", "logging.json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # everything went to the file
    written = log_file.read_text()
    assert "CUSTOM INFO worker" in written and "stopped after 3 tasks" in written
    assert add not in written  # its logger was set to WARNING
    assert f"CUSTOM ERROR tasks.broken[{broken}] failed" in written


def test_log_config_reads_yaml(project: Project, tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "logging.yaml").write_text(
        textwrap.dedent(
            """
            version: 1
            formatters: {short: {format: "YAML %(message)s"}}
            handlers: {err: {class: logging.StreamHandler, formatter: short}}
            root: {level: INFO, handlers: [err]}
            """
        )
    )
    result = project.hurtle("--log-config", "logging.yaml", "worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    assert "YAML worker" in result.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "holds a list, not a logging.config.dictConfig mapping"),
        ('{"version": 1, "handlers": {"h": {"class": "no.such.Handler"}}}', "not a configuration"),
    ],
)
def test_a_bad_log_config_is_one_line_naming_the_file(
    project: Project, tmp_path: Path, text: str, says: str
) -> None:
    (tmp_path / "bad.json").write_text(text)
    result = project.hurtle("worker", "tasks:app", "--burst", "--log-config", "bad.json")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("hurtle: error: --log-config 'bad.json'") and says in line, line
    missing = project.hurtle("worker", "tasks:app", "--log-config", "nope.json")
    assert missing.returncode == 2 and "cannot read it" in missing.stderr


def test_at_warning_a_worker_logs_no_call_lines_but_its_failures(project: Project) -> None:
    add = project.app.tasks["tasks.add"].send(2, 3).id
    broken = project.send("tasks.broken")
    result = project.hurtle("worker", "tasks:app", "--burst", "--log-level", "WARNING")
    assert result.returncode == 0, result.stderr
    assert add not in result.stderr and f"tasks.broken[{broken}] failed" in result.stderr


def test_the_help_of_log_level_says_what_a_worker_logs_at_each_level(project: Project) -> None:
    out = project.hurtle("worker", "--help").stdout
    text = " ".join(out.split())
    for words in ("a line per call while calls are few", "at WARNING, retried calls", "at ERROR"):
        assert words in text, text


# -- the switching rule, on a CallLog alone ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_call_log_switches_to_summaries_past_its_burst_and_back_after_a_quiet_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tally, clock = Tally(), Clock()
    calls = CallLog(tally, interval=10.0, clock=clock)
    with caplog.at_level("INFO", logger="hurtle.worker.log"):
        assert calls.admit(BURST)  # a whole burst
        assert not calls.admit(1) and calls.summarizing  # nothing left: summaries
        tally.add_many({("default", "t"): 500})
        clock.now += 5.0
        calls.tick()  # not yet
        assert not [r for r in caplog.records if "last " in r.getMessage()]
        clock.now += 5.0
        calls.tick()
        [line] = [r.getMessage() for r in caplog.records if "last " in r.getMessage()]
        assert line == "last 10.0 s: 500 calls (50/s): t 500 ok"
        assert calls.summarizing  # 50 a second: more than LINES_PER_SECOND
        tally.add_many({("default", "t"): int(LINES_PER_SECOND * 10)})
        clock.now += 10.0
        calls.tick()
        assert not calls.summarizing and calls.admit(BURST)  # quiet again, burst refilled


def test_the_call_log_refills_its_allowance_over_time(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    calls = CallLog(Tally(), clock=clock)
    with caplog.at_level("INFO", logger="hurtle.worker.log"):
        assert calls.admit(BURST)
        clock.now += 1.0
        assert calls.admit(int(LINES_PER_SECOND))  # one second's worth came back
        assert not calls.admit(1)
    assert not calls.admit(1)  # at WARNING nothing is logged one by one


def test_above_info_the_call_log_gathers_nothing() -> None:
    calls = CallLog(Tally(), every_call=True)
    assert not calls.admit(1)


def test_short_reprs_and_durations() -> None:
    assert short_repr(11) == "11" and short_repr(None) == "None"
    assert len(short_repr("x" * 1000)) <= 60 and len(short_repr(list(range(10**5)))) <= 60

    class Bad:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert short_repr(Bad()).startswith("<Bad instance")  # its repr raised: never the log
    assert [duration(s) for s in (0.000008, 0.0123, 1.25, 312.4)] == [
        "0.008 ms",
        "12.3 ms",
        "1.25 s",
        "312 s",
    ]
