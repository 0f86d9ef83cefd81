"""The dashboard as a person uses it: the real server (``hurtle dashboard`` under uvicorn, in a
subprocess), a real worker subprocess, a SQLite broker, and headless Chromium driven by
playwright. Screenshots go to the test's tmp dir; ``HURTLE_DASHBOARD_SCREENSHOT=path`` also
saves the overview there (that is how ``docs/dashboard.png`` is made).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import Project, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from playwright.sync_api import Page, sync_playwright  # noqa: E402

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

TASKS = """
import os
import time

from hurtle import Hurtle

app = Hurtle()


@app.task(name="work", retries=0)
def work(n):
    time.sleep(0.002)


@app.task(name="fragile", retries=0)
def fragile(n):
    if not os.path.exists(os.environ["FIXED_FLAG"]):
        raise RuntimeError("the fix is not deployed yet")
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"fragile {n}\\n")


@app.task(name="square", store_result=True)
def square(n):
    return n * n


@app.task(name="resize", retries=0)
def resize(n):
    import hurtle

    hurtle.current().progress(0.4, f"<b>resized</b> 4 of {n}")
    while not os.path.exists(os.environ["FIXED_FLAG"]):
        time.sleep(0.05)


@app.task(name="canary", queue="other", retries=0)
def canary(n):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"canary {n}\\n")


app.periodic(work, every=3600, args=(0,), name="hourly-work")
"""

pytestmark = pytest.mark.timeout(180)


def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.05)
    return value


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def project(tmp_path: Path) -> Project:
    p = Project(tmp_path, TASKS, ["work", "fragile", "square", "resize"])
    p.env["FIXED_FLAG"] = str(tmp_path / "fixed")
    p.env["HURTLE_HEARTBEAT_INTERVAL"] = "0.2"  # workers report often: a lively chart
    return p


@pytest.fixture
def server(project: Project) -> Iterator[str]:
    port = free_port()
    proc = project.popen("dashboard", "tasks:app", "--port", str(port))
    try:
        wait_for(lambda: _listening(port) or proc.poll() is not None, 30, "the dashboard")
        assert proc.poll() is None, project.output(proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def dialogs() -> list[str]:
    """The messages of the confirmation dialogs the page opened (each accepted)."""
    return []


@pytest.fixture
def page(dialogs: list[str]) -> Iterator[Page]:
    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("dialog", accept)
            yield page
        finally:
            browser.close()


@pytest.fixture
def worker(project: Project) -> Iterator[subprocess.Popen[str]]:
    proc = project.popen("worker", "tasks:app")
    yield proc
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def points(page: Page) -> list[dict[str, float]]:
    return list(page.evaluate("window.hurtleChart.points"))


def test_the_throughput_chart_moves_while_a_worker_runs_tasks(
    project: Project, server: str, page: Page, worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    project.send_many("work", [(i,) for i in range(6000)])
    page.goto(server + "/")
    wait_for(lambda: page.evaluate("window.hurtleChart.received") > 0, what="a first point")

    busy = wait_for(lambda: [p for p in points(page) if p["processed"] > 0], what="throughput")
    seen = page.evaluate("window.hurtleChart.received")
    wait_for(
        lambda: page.evaluate("window.hurtleChart.received") >= seen + 2,
        what="the chart to get new points",
    )
    assert busy[-1]["processed"] > 0
    assert page.inner_text("#workers-alive") == "1"
    wait_for(
        lambda: (
            page.inner_text("#total-processed").replace(",", "").isdigit()
            and page.inner_text("#total-processed") != "0"
        ),
        what="totals",
    )

    page.screenshot(path=str(tmp_path / "overview.png"))
    if target := os.environ.get("HURTLE_DASHBOARD_SCREENSHOT"):  # a fuller chart
        wait_for(lambda: len([p for p in points(page) if p["processed"] > 0]) >= 8)
        page.screenshot(path=target, clip={"x": 0, "y": 0, "width": 1280, "height": 570})

    page.click("nav a[data-page=workers]")
    row = wait_for(lambda: page.query_selector("#worker-table tr:nth-child(2)"), what="a row")
    assert "solo" in row.inner_text()
    page.screenshot(path=str(tmp_path / "workers.png"))


def test_retrying_a_dead_letter_from_the_page_puts_it_back_and_it_runs(
    project: Project, server: str, page: Page, worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    project.send("fragile", 7)
    wait_for(
        lambda: project.app.broker.stats(["default"])["default"].dead == 1, what="a dead letter"
    )

    page.goto(server + "/#/dead")
    button = wait_for(
        lambda: page.query_selector("#dead-table button.retry-one"),
        what="the dead letter on the page",
    )
    text = page.inner_text("#dead-table")
    assert "fragile" in text and "RuntimeError: the fix is not deployed yet" in text
    page.click("#dead-table summary")
    assert "Traceback (most recent call last)" in page.inner_text("#dead-table pre")
    page.screenshot(path=str(tmp_path / "dead.png"))

    (tmp_path / "fixed").touch()  # the fix is deployed
    button.click()
    wait_for(lambda: "fragile 7" in project.runs(), what="the retried task to run")
    wait_for(
        lambda: page.query_selector("#dead-table button.retry-one") is None,
        what="the page to drop the retried dead letter",
    )
    assert project.app.broker.stats(["default"])["default"].dead == 0


def test_the_dead_letters_page_shows_each_calls_arguments_as_text_and_says_which_are_no_message(
    project: Project, server: str, page: Page, worker: subprocess.Popen[str]
) -> None:
    markup = '<b id="bold">x</b><img src=x onerror="window.hurtlePwned=1">'
    project.send("fragile", markup)
    project.app.broker.publish_raw("default", [b"\x93not a hurtle message"])
    wait_for(
        lambda: project.app.broker.stats(["default"])["default"].dead == 2, what="dead letters"
    )
    page.goto(server + "/#/dead")
    wait_for(
        lambda: len(page.query_selector_all("#dead-table button.retry-one")) == 2,
        what="both dead letters on the page",
    )
    shown = page.inner_text("#dead-table code.arguments")
    assert json.loads(shown) == [markup]  # the JSON text of the arguments, as text
    assert page.query_selector("#dead-table #bold, #dead-table img") is None  # never as HTML
    assert page.evaluate("window.hurtlePwned") is None
    undecodable = page.inner_text("#dead-table .undecodable")
    assert undecodable.startswith("undecodable: not a valid hurtle message (21 bytes)")


def test_purging_a_queues_dead_letters_from_the_page_asks_first(
    project: Project,
    server: str,
    page: Page,
    worker: subprocess.Popen[str],
    dialogs: list[str],
) -> None:
    project.send_many("fragile", [(1,), (2,)])
    wait_for(
        lambda: project.app.broker.stats(["default"])["default"].dead == 2, what="two dead letters"
    )
    page.goto(server + "/#/queues")
    wait_for(lambda: "2" in page.inner_text("#queue-table"), what="the queue's dead count")
    page.click("#queue-table button.purge-dead[data-queue=default]")
    wait_for(lambda: project.app.broker.stats(["default"])["default"].dead == 0, what="the purge")
    assert len(dialogs) == 1 and "Delete all 2 dead letters of queue default" in dialogs[0]


def test_looking_a_task_up_by_id_shows_its_result_and_arguments(
    project: Project, server: str, page: Page, worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    message_id = project.send("square", 12)
    wait_for(lambda: project.app.broker.get_result(message_id), what="the stored result")

    page.goto(server + "/#/task")
    page.fill("#task-id", message_id)
    page.click("#task-form button")
    wait_for(lambda: page.inner_text("#task-state") == "succeeded", what="the task's state")
    text = page.inner_text("#task-table")
    assert "square" in text and "144" in text and "12" in text
    assert "Started" in text and "Finished" in text and " ms" in text
    page.screenshot(path=str(tmp_path / "task.png"))

    # an id with no record: the page says so, and why there may be none
    page.fill("#task-id", "no-such-message")
    page.click("#task-form button")
    wait_for(lambda: page.inner_text("#task-state") == "unknown", what="an unknown state")
    assert "keep no result" in page.inner_text("#task-note")
    assert "square" in page.inner_text("#task-note")  # the tasks that do keep results


def test_a_running_tasks_progress_shows_on_its_page_as_text_and_follows_it(
    project: Project, server: str, page: Page, worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    message_id = project.send("resize", 10)
    page.goto(server + f"/#/task/{message_id}")
    # the page follows a task that reports progress: no reload asked for
    wait_for(lambda: "40 %" in page.inner_text("#task-table"), what="the progress report")
    text = page.inner_text("#task-table")
    assert "<b>resized</b> 4 of 10" in text  # the task's text, shown as text
    assert page.locator("#task-table b").count() == 0  # never as markup
    assert page.locator("#task-table progress").count() == 1
    (tmp_path / "fixed").touch()


def test_the_scheduled_page_shows_periodic_tasks_and_delayed_messages(
    project: Project, server: str, page: Page, tmp_path: Path
) -> None:
    project.app.tasks["work"].options(delay=900).send(1)
    page.goto(server + "/#/scheduled")
    row = wait_for(
        lambda: page.query_selector("#schedule-table tr:nth-child(2)"), what="the schedule"
    )
    text = row.inner_text()
    assert "hourly-work" in text and "every 3600s" in text and "never" in text
    wait_for(lambda: "default" in page.inner_text("#delayed-table"), what="the delayed count")
    delayed = page.inner_text("#delayed-table")
    assert "counts only" not in delayed  # SQLite lists the ETAs of the soonest ones
    page.screenshot(path=str(tmp_path / "scheduled.png"))


def queue_row(server: str, name: str) -> dict[str, Any]:
    """The queue's row as the JSON API gives it."""
    with urllib.request.urlopen(server + "/api/queues", timeout=10) as r:
        rows = json.load(r)
    return next(q for q in rows if q["name"] == name)


def processed(server: str, task: str) -> int:
    """The cluster's processed counter of ``task``, as workers reported it."""
    with urllib.request.urlopen(server + "/api/tasks", timeout=10) as r:
        return sum(row["processed"] for row in json.load(r) if row["task"] == task)


def test_pausing_a_queue_from_the_page_stops_its_consumption_until_resumed(
    project: Project,
    server: str,
    page: Page,
    worker: subprocess.Popen[str],
    dialogs: list[str],
    tmp_path: Path,
) -> None:
    project.app.task(name="canary", queue="other", retries=0)(lambda *a: None)
    # the worker runs at all: it takes a first canary
    project.send("canary", 1)
    wait_for(lambda: "canary 1" in project.runs(), what="the worker to run a first task")

    page.goto(server + "/#/queues")
    pause = "#queue-table button.pause-queue[data-queue=default]"
    wait_for(lambda: page.query_selector(pause), what="the pause button")
    page.click(pause)  # by selector: the table is redrawn every 2 s
    wait_for(lambda: queue_row(server, "default")["paused"], what="the queue to be paused")
    wait_for(
        lambda: page.query_selector("#queue-table button.resume-queue[data-queue=default]"),
        what="the page to offer a resume",
    )
    assert "Pause queue default?" in dialogs[0]
    assert "paused" in page.inner_text("#queue-status")
    done_before = processed(server, "work")

    project.send_many("work", [(i,) for i in range(20)])
    # Sent after them, from a queue the worker serves after theirs: once it ran, the worker
    # has fetched since the pause, and would have taken the queue's messages first.
    project.send("canary", 2)
    wait_for(lambda: "canary 2" in project.runs(), what="the worker to fetch after the pause")
    row = queue_row(server, "default")
    assert (row["ready"], row["in_flight"], row["paused"]) == (20, 0, True)
    # and its next report (which counts the second canary) still counts no work done
    wait_for(lambda: processed(server, "canary") >= 2, what="the worker's next report")
    assert processed(server, "work") == done_before
    wait_for(lambda: "20" in page.inner_text("#queue-table"), what="the page to show 20 ready")
    page.screenshot(path=str(tmp_path / "queues-paused.png"))

    page.click("#queue-table button.resume-queue[data-queue=default]")
    wait_for(
        lambda: (lambda q: (q["ready"], q["in_flight"], q["paused"]) == (0, 0, False))(
            queue_row(server, "default")
        ),
        what="every message of the resumed queue to be consumed",
    )
    wait_for(lambda: processed(server, "work") >= done_before + 20, what="the work done")
    assert "Resume queue default?" in dialogs[1]
    wait_for(
        lambda: page.query_selector("#queue-table button.pause-queue[data-queue=default]"),
        what="the page to offer a pause again",
    )
    page.screenshot(path=str(tmp_path / "queues-resumed.png"))


def test_purging_a_queue_from_the_page_asks_first_and_keeps_its_dead_letters(
    project: Project, server: str, page: Page, dialogs: list[str], tmp_path: Path
) -> None:
    project.app.broker.pause("default")  # no worker here; paused so that nothing else counts
    project.send_many("work", [(i,) for i in range(5)])
    project.app.tasks["work"].options(delay=900).send(99)
    page.goto(server + "/#/queues")
    wait_for(lambda: "5" in page.inner_text("#queue-table"), what="the queue's ready count")
    page.screenshot(path=str(tmp_path / "queues.png"))
    page.click("#queue-table button.purge-queue[data-queue=default]")
    wait_for(lambda: queue_row(server, "default")["ready"] == 0, what="the purge")
    row = queue_row(server, "default")
    assert (row["delayed"], row["paused"]) == (0, True)
    assert len(dialogs) == 1 and "Drop the 5 ready and 1 delayed messages" in dialogs[0]
    wait_for(lambda: "6 messages dropped" in page.inner_text("#queue-status"), what="the status")


def view(page: Page) -> dict[str, Any]:
    """What the chart's last drawing showed: x-axis labels, y-axis ticks, points' x."""
    return dict(page.evaluate("window.hurtleChart.view"))


def test_the_chart_keeps_time_on_its_axis_integer_ticks_and_moves_every_second(
    project: Project, server: str, page: Page, tmp_path: Path
) -> None:
    page.goto(server + "/")
    wait_for(lambda: page.evaluate("window.hurtleChart.received") > 0, what="a first point")
    assert view(page)["yTicks"] == [0, 1]  # idle: whole numbers, once each
    cards = page.inner_text(".cards")
    for label in ("Processed, total", "Failed, total", "Dead-lettered, total"):
        assert label in cards
    assert "Workers alive now" in cards
    assert "now" in page.inner_text("#overview h2:has(+ #overview-queues)")

    # beats 5 s apart (the usual quarter of the timeout): the figures must move in between
    project.send_many("work", [(i,) for i in range(6000)])
    worker = project.popen("worker", "tasks:app", HURTLE_HEARTBEAT_INTERVAL="5")
    try:

        def moved_twice_within_a_beat() -> bool:
            pts = [p for p in points(page) if p["processed"] > 0]
            return any(
                len({p["processed"] for p in pts[i - 2 : i + 1]}) == 3
                and pts[i]["t"] - pts[i - 2]["t"] < 5
                for i in range(2, len(pts))
            )

        wait_for(moved_twice_within_a_beat, what="the rate to change twice between two beats")
        wait_for(
            lambda: (
                page.inner_text("#total-processed").replace(",", "").isdigit()
                and page.inner_text("#total-processed") != "0"
            ),
            what="the processed total to move",
        )
        drawn = view(page)
        assert drawn["xLabels"] and all(
            len(label) == 8 and label[2] == label[5] == ":" and label.replace(":", "").isdigit()
            for label in drawn["xLabels"]
        ), drawn["xLabels"]
        ticks = drawn["yTicks"]
        assert ticks[0] == 0 and all(isinstance(t, int) for t in ticks), ticks
        assert ticks == sorted(set(ticks)) and len(ticks) >= 2
        xs = drawn["xs"]  # x proportional to time, not to the count of points
        per_second = (xs[-1]["x"] - xs[0]["x"]) / (xs[-1]["t"] - xs[0]["t"])
        for a, b in itertools.pairwise(xs):
            assert abs((b["x"] - a["x"]) - per_second * (b["t"] - a["t"])) < 0.5
        page.screenshot(path=str(tmp_path / "chart.png"))
    finally:
        worker.terminate()
        worker.wait(30)

    # a point a quarter of an hour later: the earlier ones leave the window, none is joined
    page.evaluate(
        "(() => { const ps = window.hurtleChart.points; const last = ps[ps.length - 1];"
        " addPoint({t: last.t + 900, processed: 0, failed: 0}); })()"
    )
    later = view(page)
    assert len(later["xs"]) == 1 and later["yTicks"] == [0, 1]
