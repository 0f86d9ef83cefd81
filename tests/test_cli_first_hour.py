"""What a new user meets in the first hour of ``hurtle``, in real subprocesses: destructive
commands ask (and refuse without a terminal), ``dead show``, commands that never create an empty
database and say which file they use, "did you mean", a rebuilt handle's repr, and README's list
of commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT, Project, hurtle_env, run_hurtle, run_hurtle_at_a_terminal
from hurtle import Hurtle
from hurtle.brokers import make_broker
from hurtle.errors import ConfigurationError, ResultTimeout

TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="tasks.broken", retries=0)
    def broken(n, tag=None):
        raise ValueError(f"broken {n}")


    @app.task(name="tasks.add")
    def add(x, y):
        return x + y
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    p = Project(tmp_path, TASKS, ("tasks.add",))
    p.app.task(name="tasks.broken", retries=0)(lambda n, tag=None: None)  # to send it
    yield p
    p.app.close()


def dead_letters(project: Project, *numbers: int) -> list[str]:
    """Send ``broken(n, tag=...)`` for each n and run a burst worker; the message ids."""
    ids = [project.app.tasks["tasks.broken"].send(n, tag=f"t{n}").id for n in numbers]
    done = project.hurtle("worker", "tasks:app", "--burst")
    assert done.returncode == 0, done.stderr
    assert project.stats()["dead"] == len(numbers)
    return ids


def last_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command that failed with exit status 2."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("hurtle: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


# -- destructive commands ask; --yes skips; no terminal, no --yes: refused -----------------------


def test_dead_purge_asks_at_a_terminal_and_only_a_yes_purges(project: Project) -> None:
    dead_letters(project, 1, 2)
    kept = run_hurtle_at_a_terminal(
        "dead", "tasks:app", "purge", answer="n\n", cwd=project.root, **project.env
    )
    assert kept.returncode == 1, (kept.stdout, kept.stderr)
    assert "2 dead letter(s) of 'default' deleted for good" in kept.stdout
    assert "[y/N]" in kept.stdout and "nothing done" in kept.stdout
    assert project.stats()["dead"] == 2
    purged = run_hurtle_at_a_terminal(
        "dead", "tasks:app", "purge", answer="y\n", cwd=project.root, **project.env
    )
    assert purged.returncode == 0, purged.stderr
    assert "purged 2 dead letters" in purged.stdout
    assert project.stats()["dead"] == 0


def test_dead_purge_of_named_dead_letters_asks_too(project: Project) -> None:
    ids = dead_letters(project, 1, 2)
    kept = run_hurtle_at_a_terminal(
        "dead", "tasks:app", "purge", ids[0], answer="no\n", cwd=project.root, **project.env
    )
    assert kept.returncode == 1 and "purge 1 dead letter(s) named by id" in kept.stdout
    assert project.stats()["dead"] == 2


@pytest.mark.parametrize(
    "command",
    [
        ("dead", "tasks:app", "purge"),
        ("dead", "tasks:app", "purge", "{id}"),
        ("queue", "tasks:app", "purge", "default"),
    ],
    ids=["dead-purge", "dead-purge-id", "queue-purge"],
)
def test_a_destructive_command_without_a_terminal_refuses_in_one_line_unless_yes(
    project: Project, command: tuple[str, ...]
) -> None:
    [message_id] = dead_letters(project, 1)
    project.send("tasks.add", 1, 2)
    before = project.stats()
    args = [a.format(id=message_id) for a in command]
    refused = project.hurtle(*args)  # stdin is no terminal
    line = last_error(refused)
    assert line.startswith("hurtle: error: refusing to purge ")
    assert "stdin is not a terminal" in line and "pass --yes" in line
    assert project.stats() == before
    done = project.hurtle(*args, "--yes")
    assert done.returncode == 0, done.stderr
    assert project.stats() != before


@pytest.mark.parametrize(
    "command",
    [
        ("dead", "tasks:app", "retry"),
        ("cancel", "tasks:app", "0123456789abcdef01234567"),
        ("queue", "tasks:app", "pause", "default"),
        ("queue", "tasks:app", "resume", "default"),
        ("queue", "tasks:app", "forget", "nothing-here"),
    ],
    ids=["dead-retry", "cancel", "pause", "resume", "forget"],
)
def test_commands_that_destroy_nothing_do_not_ask(
    project: Project, command: tuple[str, ...]
) -> None:
    dead_letters(project, 1)
    result = project.hurtle(*command)
    assert result.returncode == 0, result.stderr
    assert "[y/N]" not in result.stdout


def test_a_benchmark_given_a_users_redis_asks_before_flushing_it(
    redis_url: str, tmp_path: Path
) -> None:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(redis_url)
    client.set("users-key", "precious")
    try:
        refused = run_hurtle(
            "bench", "io", "--count", "10", "--variants", "cpu", "--redis-url", redis_url,
            cwd=tmp_path, timeout=300,
        )  # fmt: skip
        line = last_error(refused)
        assert line.startswith("hurtle: error: refusing to flush redis://127.0.0.1:")
        assert "pass --yes" in line
        assert client.get("users-key") == b"precious"
    finally:
        client.delete("users-key")
        client.close()


# -- hurtle dead show ------------------------------------------------------------------------------


def test_dead_show_prints_everything_a_dead_letter_holds_by_either_id(project: Project) -> None:
    [message_id] = dead_letters(project, 7)
    [row] = json.loads(project.hurtle("dead", "tasks:app", "list", "--json").stdout)
    for ident in (message_id, row["id"]):
        out = project.hurtle("dead", "tasks:app", "show", ident)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert re.search(rf"^dead letter\s+{row['id']}$", text, re.M), text
        assert re.search(rf"^message\s+{message_id}$", text, re.M), text
        assert re.search(r"^queue\s+default$", text, re.M), text
        assert re.search(r"^task\s+tasks\.broken$", text, re.M), text
        assert re.search(r"^args\s+\[7\]$", text, re.M), text
        assert re.search(r'^kwargs\s+\{"tag": "t7"\}$', text, re.M), text
        assert re.search(r"^attempt\s+1 ", text, re.M), text
        assert re.search(r"^sent at\s+\d{4}-\d\d-\d\dT", text, re.M), text
        assert re.search(r"^failed at\s+\d{4}-\d\d-\d\dT", text, re.M), text
        assert "Traceback (most recent call last)" in text  # the whole reason, not a summary
        assert 'raise ValueError(f"broken {n}")' in text and "ValueError: broken 7" in text
    doc = json.loads(project.hurtle("dead", "tasks:app", "show", message_id, "--json").stdout)
    assert [(d["id"], d["message_id"], d["task"], d["args"], d["kwargs"]) for d in doc] == [
        (row["id"], message_id, "tasks.broken", [7], {"tag": "t7"})
    ]
    assert doc[0]["attempt"] == 1 and doc[0]["queue"] == "default"
    assert doc[0]["sent_at"] <= doc[0]["failed_at"]
    assert "Traceback (most recent call last)" in doc[0]["reason"]


def test_dead_show_of_bytes_that_are_no_message_says_so(project: Project) -> None:
    project.app.broker.publish_raw("default", [b"\xc1 no message"])
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    [row] = json.loads(project.hurtle("dead", "tasks:app", "list", "--json").stdout)
    out = project.hurtle("dead", "tasks:app", "show", row["id"])
    assert out.returncode == 0, out.stderr
    assert re.search(r"^message\s+none: not a hurtle message \(12 bytes\)", out.stdout, re.M)
    assert re.search(r"^bytes\s+c1206e6f", out.stdout, re.M), out.stdout


def test_dead_show_of_an_unknown_id_exits_1_and_without_an_id_exits_2(project: Project) -> None:
    dead_letters(project, 1)
    unknown = project.hurtle("dead", "tasks:app", "show", "no-such-id")
    assert unknown.returncode == 1 and "'no-such-id'" in unknown.stderr
    assert "needs the id of a dead letter" in last_error(
        project.hurtle("dead", "tasks:app", "show")
    )


# -- no command but the worker creates a database; each names the file it uses ------------------


ELSEWHERE_APP = 'from hurtle import Hurtle\napp = Hurtle("sqlite:///hurtle.db")\n'


@pytest.fixture
def elsewhere(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A directory with no database, and the environment that imports an app whose file is
    ``sqlite:///hurtle.db`` (relative) from another directory: ``cd elsewhere && hurtle ...``."""
    app_dir, other = tmp_path / "app", tmp_path / "elsewhere"
    app_dir.mkdir()
    other.mkdir()
    (app_dir / "tasks.py").write_text(ELSEWHERE_APP)
    env = hurtle_env()
    env.pop("HURTLE_BROKER_URL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(app_dir)])
    return other, env


def hurtle_in(where: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hurtle", *args],
        cwd=where,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [
        ("status", "tasks:app"),
        ("status", "tasks:app", "--json"),
        ("dead", "tasks:app", "list"),
        ("dead", "tasks:app", "show", "0123456789abcdef01234567"),
        ("dead", "tasks:app", "retry"),
        ("dead", "tasks:app", "purge", "--yes"),
        ("schedule", "tasks:app", "list"),
        ("cancel", "tasks:app", "0123456789abcdef01234567"),
        ("queue", "tasks:app", "pause", "default"),
        ("queue", "tasks:app", "purge", "default", "--yes"),
        ("dashboard", "tasks:app", "--port", "1"),
    ],
    ids=lambda c: "-".join(a for a in c if not a.startswith(("tasks:", "0123", "-")))[:30],
)
def test_a_command_run_where_there_is_no_database_says_so_and_creates_none(
    elsewhere: tuple[Path, dict[str, str]], command: tuple[str, ...]
) -> None:
    where, env = elsewhere
    line = last_error(hurtle_in(where, env, *command))
    assert f"'{where / 'hurtle.db'}'" in line  # the absolute path it looked for
    assert "does not exist, and nothing was created" in line
    assert "run from the directory of your app, or set HURTLE_BROKER_URL" in line
    assert sorted(os.listdir(where)) == []


def test_the_worker_still_creates_its_database(elsewhere: tuple[Path, dict[str, str]]) -> None:
    where, env = elsewhere
    result = hurtle_in(where, env, "worker", "tasks:app", "--burst")
    assert result.returncode == 0, result.stderr
    assert (where / "hurtle.db").is_file()


def test_every_command_names_the_absolute_path_of_its_sqlite_file(project: Project) -> None:
    [message_id] = dead_letters(project, 1)
    relative = {"HURTLE_BROKER_URL": "sqlite:///hurtle.db"}  # the project's file, relatively
    said = f"broker: sqlite:///hurtle.db (file {project.root.resolve() / 'hurtle.db'})"
    for command in (
        ("status", "tasks:app"),
        ("schedule", "tasks:app", "list"),
        ("dead", "tasks:app", "list"),
        ("dead", "tasks:app", "list", "--json"),
        ("dead", "tasks:app", "show", message_id),
        ("dead", "tasks:app", "retry", "--queue", "nowhere"),
        ("cancel", "tasks:app", "0123456789abcdef01234567"),
        ("queue", "tasks:app", "pause", "default"),
        ("queue", "tasks:app", "forget", "nothing-here"),
    ):
        out = project.hurtle(*command, **relative)
        assert out.returncode == 0, (command, out.stderr)
        assert said in out.stdout + out.stderr, (command, out.stdout, out.stderr)
    doc = json.loads(project.hurtle("status", "tasks:app", "--json", **relative).stdout)
    assert doc["file"] == str(project.root.resolve() / "hurtle.db")
    doc = json.loads(project.hurtle("schedule", "tasks:app", "list", "--json", **relative).stdout)
    assert doc["file"] == str(project.root.resolve() / "hurtle.db")


def test_make_broker_with_create_false_opens_only_an_existing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(ConfigurationError, match=re.escape(f"'{missing}'")):
        make_broker(f"sqlite:///{missing}", create=False)
    assert not missing.exists()
    make_broker(f"sqlite:///{missing}").close()  # create=True, the default, makes it
    broker = make_broker(f"sqlite:///{missing}", create=False)
    try:
        assert broker.queues() == []
    finally:
        broker.close()


# -- did you mean -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "usage", "hint"),
    [
        (("wroker",), "usage: hurtle ", "did you mean 'worker'?"),
        (("dead", "tasks:app", "lst"), "usage: hurtle dead ", "did you mean 'list'?"),
        (("bench", "tsks"), "usage: hurtle bench ", "did you mean 'tasks'?"),
        (("queue", "tasks:app", "prge", "q"), "usage: hurtle queue ", "did you mean 'purge'?"),
        (
            ("worker", "tasks:app", "--concurency", "4"),
            "usage: hurtle worker ",
            "did you mean --concurrency?",
        ),
        (("status", "tasks:app", "--jsn"), "usage: hurtle status ", "did you mean --json?"),
    ],
)
def test_a_mistyped_command_or_option_gets_did_you_mean_and_its_subcommands_usage(
    project: Project, command: tuple[str, ...], usage: str, hint: str
) -> None:
    result = project.hurtle(*command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(usage), result.stderr
    assert hint in result.stderr.splitlines()[-1], result.stderr


# -- a handle rebuilt by id names its task once a record was read --------------------------------


def test_a_handle_rebuilt_by_id_names_its_task_once_it_read_a_record() -> None:
    app = Hurtle("memory://", store_results=True)
    try:

        @app.task(name="tasks.add")
        def add(x: int, y: int) -> int:
            return x + y

        sent = add.send(1, 2)
        app.worker(burst=True).run()
        rebuilt = app.handle(sent.id)
        assert repr(rebuilt) == f"<Handle [{sent.id}]>"  # nothing read yet: no name, no '?'
        assert rebuilt.state() == "succeeded"
        assert repr(rebuilt) == f"<Handle tasks.add[{sent.id}]>"
        waited = app.handle(sent.id)
        assert waited.result(5) == 3 and repr(waited) == f"<Handle tasks.add[{sent.id}]>"
        unknown = app.handle("0123456789abcdef01234567")
        with pytest.raises(ResultTimeout) as raised:
            unknown.result(0)
        assert "no result for message 0123456789abcdef01234567" in str(raised.value)
    finally:
        app.close()


# -- README ---------------------------------------------------------------------------------------


def test_readme_lists_every_command_and_every_benchmark() -> None:
    from hurtle.cli import build_parser

    def commands_in(text: str) -> set[tuple[str, ...]]:
        blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        found: set[tuple[str, ...]] = set()
        for line in lines:
            if line.startswith("hurtle "):
                command, _, rest = line.split(None, 1)[1].partition(" ")
                for word in rest.split()[:2]:  # `bench a|b|c` names several
                    found |= {(command, choice) for choice in word.split("|")}
                found.add((command,))
        return found

    readme = (ROOT / "README.md").read_text()
    commands_block = readme[readme.index("\n## Commands\n") : readme.index("\n## What it does\n")]
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    benchmarks = next(a for a in commands["bench"]._actions if a.dest == "bench_command").choices
    listed = commands_in(commands_block)
    assert {c for c in commands if (c,) not in listed} == set()
    assert {b for b in benchmarks if ("bench", b) not in listed} == set()
