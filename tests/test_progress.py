"""Progress reports: ``hurtle.current().progress(fraction, message)`` inside a task, read back
by ``Handle.progress()`` while the task runs and after it ended, in every pool, throttled to
one broker write per interval however often a task reports; workflow handles read their
members' reports."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import hurtle
from hurtle import Hurtle, Message, Progress, chain, group
from hurtle.brokers import Delivery, StoredResult
from hurtle.brokers.memory import MemoryBroker
from hurtle.context import bind, unbind
from hurtle.errors import BrokerError, ConfigurationError, HurtleError
from hurtle.progress import decode_progress
from hurtle.worker import Worker
from hurtle.worker.tracker import Tracker


@pytest.fixture(params=["sqlite", "redis"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hurtle]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    else:
        url = str(request.getfixturevalue("redis_url"))
    a = Hurtle(url)
    yield a
    a.close()


def wait_for(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout}s")
        time.sleep(0.02)


def run_worker(app: Hurtle, pool: str, **options: Any) -> tuple[Worker, threading.Thread]:
    worker = app.worker(pool=pool, concurrency=2 if pool != "solo" else 1, **options)
    return worker, worker.run_in_thread()


@pytest.mark.parametrize("pool", ["solo", "threads", "asyncio"])
def test_a_running_task_reports_progress_that_its_handle_reads(app: Hurtle, pool: str) -> None:
    release = threading.Event()

    @app.task
    def resize(n: int) -> None:
        now = hurtle.current()
        for i in range(n):
            now.progress((i + 1) / (2 * n), f"resized {i + 1} of {2 * n}")
        release.wait(10)
        now.progress(1.0, "all done")

    worker, thread = run_worker(app, pool)
    try:
        h = resize.send(4)
        seen = wait_for(h.progress)
        assert seen == Progress(0.5, "resized 4 of 8", seen.at) and seen.at > 0
        release.set()
        last = wait_for(lambda: (p := h.progress()) is not None and p.fraction == 1.0 and p)
        assert last.message == "all done"
    finally:
        release.set()
        worker.stop()
        thread.join(10)


def test_an_async_task_reports_progress_from_its_coroutine(app: Hurtle) -> None:
    @app.task
    async def crawl(pages: int) -> None:
        for i in range(pages):
            await asyncio.sleep(0)
            hurtle.current().progress((i + 1) / pages, f"page {i + 1}")

    worker, thread = run_worker(app, "asyncio")
    try:
        handles = [crawl.send(3), crawl.send(5)]
        for h, pages in zip(handles, (3, 5), strict=True):
            last = wait_for(h.progress)
            assert (last.fraction, last.message) == (1.0, f"page {pages}")
    finally:
        worker.stop()
        thread.join(10)


def test_a_tight_loop_of_reports_costs_one_write_per_interval(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")

    @app.task
    def busy(n: int) -> None:
        now = hurtle.current()
        for i in range(n):
            now.progress(i / n, f"step {i}")

    worker = app.worker(pool="solo", burst=True)
    worker.progress_interval = 3600.0  # no write while it runs: only the one at the stop
    h = busy.send(50_000)
    worker.run()
    assert worker.tracker is not None and worker.tracker.writes == 1
    last = h.progress()
    assert last is not None and (last.fraction, last.message) == (49_999 / 50_000, "step 49999")
    app.close()


def test_workflow_handles_read_their_members_progress(app: Hurtle) -> None:
    @app.task
    def step(x: int, done: float = 0.5) -> int:
        hurtle.current().progress(done, f"step {x}")
        return x

    worker, thread = run_worker(app, "threads")
    try:
        flow = chain(step.s(1, 1.0), step.s(0.25)).send()
        assert len(flow.members) == 2
        reports = wait_for(lambda: all(flow.members_progress()) and flow.members_progress())
        assert [(p.fraction, p.message) for p in reports] == [(1.0, "step 1"), (0.25, "step 1")]
        g = group(step.s(i, i / 10) for i in range(3)).send()
        found = wait_for(lambda: all(g.progress()) and g.progress())
        assert [p.message for p in found] == ["step 0", "step 1", "step 2"]
    finally:
        worker.stop()
        thread.join(10)


def test_current_outside_a_worker_says_so_and_bad_reports_are_refused(app: Hurtle) -> None:
    with pytest.raises(HurtleError, match="outside a task run by a worker"):
        hurtle.current()
    assert hurtle.current(None) is None
    errors: list[str] = []

    @app.task(store_result=True)
    def bad(value: Any) -> None:
        try:
            hurtle.current().progress(value)
        except ConfigurationError as err:
            errors.append(str(err))

    worker, thread = run_worker(app, "solo")
    try:
        for value in (1.5, -0.1, float("nan"), "half", True):
            bad.send(value).result(10)
    finally:
        worker.stop()
        thread.join(10)
    assert len(errors) == 5 and all("fraction from 0 to 1" in e for e in errors)


def test_reports_a_broker_refused_are_written_at_the_next_write_with_what_is_newer() -> None:
    refused: list[int] = []

    class RefusesOnce(MemoryBroker):
        def put_progress(self, reports: Sequence[StoredResult]) -> None:
            if not refused:
                refused.append(len(reports))
                raise BrokerError("the store is down")
            super().put_progress(reports)

    broker = RefusesOnce()
    tracker = Tracker(broker, 3600.0)  # written only when flushed here
    runs = [Delivery("default", Message(id=i, task="t", queue="default").encode(), 0) for i in "ab"]
    running = runs[0]
    bind(lambda: running, tracker)
    try:
        hurtle.current().progress(0.25, "a once")
        running = runs[1]
        hurtle.current().progress(0.25, "b first")
        tracker.flush()  # refused: both kept
        hurtle.current().progress(0.5, "b newer")
        tracker.flush()
    finally:
        unbind()
        tracker.close()
    assert refused == [2] and tracker.writes == 1
    stored = [decode_progress(p) for p in broker.get_progress(["a", "b"])]
    assert [(p.fraction, p.message) for p in stored if p] == [(0.25, "a once"), (0.5, "b newer")]
