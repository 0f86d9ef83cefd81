"""``hurtle.testing``: eager mode runs each send through the real pipeline before it returns,
``drain`` runs a real worker until the queues are idle on every broker, and the pytest plugin's
fixtures work when a project enables them (and only then)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hurtle import (
    ArgumentError,
    EncodeError,
    Hurtle,
    Reject,
    Retry,
    TaskFailed,
    chain,
    chord,
    group,
)
from hurtle.brokers.memory import MemoryBroker
from hurtle.errors import ConfigurationError, ResultError
from hurtle.message import Message
from hurtle.testing import DrainTimeout, Summary, drain, eager
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures

pytest_plugins = ["pytester"]


def _app(**settings: Any) -> Hurtle:
    return Hurtle("memory://", store_results=True, **settings)


# -- eager mode ------------------------------------------------------------------------------


def test_an_eager_send_returns_once_its_task_ran_with_the_result_stored() -> None:
    app = _app()
    calls: list[tuple[int, int]] = []

    @app.task
    def add(x: int, y: int) -> int:
        calls.append((x, y))
        return x + y

    with eager(app) as runs:
        handle = add.send(2, 3)
        assert calls == [(2, 3)]
        assert handle.state() == "succeeded"  # read now: no waiting
        assert handle.result(timeout=0) == 5
        assert [h.result(timeout=0) for h in add.send_many([(1, 1), (2, 2)])] == [2, 4]
    assert (runs.ran, runs.failed, runs.retried, runs.dead) == (3, 0, 0, 0)
    assert runs.task(add).processed == 3
    assert isinstance(runs, Summary)


def test_eager_mode_has_a_store_of_its_own_and_leaves_the_app_s_broker_alone(
    tmp_path: Path,
) -> None:
    db = tmp_path / "never.db"
    app = Hurtle(f"sqlite:///{db}", store_results=True)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with eager(app):
        assert add.send(1, 2).result(timeout=0) == 3
        assert isinstance(app.broker, MemoryBroker)
    assert app._broker is None  # never connected: the file was never made
    assert not db.exists()
    with eager(app), eager(app):  # nested blocks put back what they found
        assert add.send(1, 1).result(timeout=0) == 2
    assert app._broker is None
    app.close()


def test_an_eager_failure_is_retried_at_once_then_dead_lettered_as_in_production() -> None:
    app = _app()
    attempts: list[int] = []

    @app.task(retries=3, retry_delay=3600)  # a worker would wait an hour, then two...
    def charge(amount: int) -> None:
        attempts.append(amount)
        raise ValueError(f"cannot charge {amount}")

    with eager(app) as runs:
        handle = charge.send(-5)
        assert attempts == [-5] * 4
        assert handle.state() == "dead"
        with pytest.raises(TaskFailed) as failed:
            handle.result(timeout=0)
        assert (failed.value.type, failed.value.message) == ("ValueError", "cannot charge -5")
        [dead] = app.broker.dead_letters("default")
        message = dead.message()
        assert message is not None and message.args == (-5,)
        assert "no retries left" in dead.reason
    assert (runs.ran, runs.failed, runs.retried, runs.dead) == (4, 4, 3, 1)


def test_retry_with_a_delay_and_a_dead_letter_retried_run_at_once() -> None:
    app = _app()
    attempts: list[int] = []

    @app.task(retries=1)
    def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise Retry(delay=3600)
        if len(attempts) == 2:
            raise Reject("not now")
        return len(attempts)

    with eager(app):
        handle = flaky.send()
        assert handle.state() == "dead"  # Retry ran at once, then Reject
        assert app.broker.retry_dead("default") == 1  # runs again, now
        assert len(attempts) == 3
        assert app.broker.dead_letters("default") == []


def test_propagate_raises_the_task_s_own_exception_at_the_send_once_retries_are_spent() -> None:
    app = _app()
    attempts: list[int] = []

    @app.task(retries=2, retry_delay=3600)
    def charge(amount: int) -> None:
        attempts.append(amount)
        raise ValueError(f"cannot charge {amount}")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with eager(app, propagate=True):
        with pytest.raises(ValueError, match="cannot charge -1") as raised:
            charge.send(-1)
        assert attempts == [-1] * 3
        assert any("run eagerly" in note for note in raised.value.__notes__)
        assert add.send(1, 2).result(timeout=0) == 3  # a success raises nothing


def test_what_production_refuses_is_refused_in_eager_mode() -> None:
    app = _app()
    ran: list[object] = []

    @app.task(retries=0)
    def add(x: Any, y: Any) -> Any:
        ran.append(x)
        return x + y

    @app.task(retries=0)
    def opaque() -> object:
        return object()

    with eager(app):
        with pytest.raises(EncodeError):
            add.send(object(), 1)
        with pytest.raises(ArgumentError):
            add.send(1, 2, z=3)  # type: ignore[call-arg]
        assert ran == []
        with pytest.raises(TaskFailed) as failed:
            opaque.send().result(timeout=0)
        assert failed.value.type == ResultError.__name__
        # the task receives what MessagePack carries: a tuple arrives as a list
        assert add.send(("a", "b"), ["c"]).result(timeout=0) == ["a", "b", "c"]
        assert len(app.broker.dead_letters("default")) == 1


def test_delay_and_eta_sends_run_at_once() -> None:
    app = _app()

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with eager(app):
        assert add.options(delay=3600).send(1, 1).result(timeout=0) == 2
        assert add.options(eta=time.time() + 3600).send(2, 2).result(timeout=0) == 4
        assert add.apply_async((3, 3), countdown=3600).result(timeout=0) == 6


def test_chains_groups_and_chords_complete_before_send_returns() -> None:
    app = Hurtle("memory://")  # a workflow keeps its result whatever store_result says

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task
    def total(numbers: list[int]) -> int:
        return sum(numbers)

    with eager(app):
        steps = chain(add.s(1, 2), add.s(10).options(queue="elsewhere", delay=60), add.s(100))
        handle = steps.send()
        assert handle.state() == "succeeded"
        assert handle.result(timeout=0) == 113
        assert group(add.s(i, i) for i in range(5)).send().result(timeout=0) == [0, 2, 4, 6, 8]
        members = group(add.s(i, i) for i in range(10))
        assert chord(members, total.s()).send().result(timeout=0) == 90


def test_a_workflow_step_that_fails_fails_the_workflow_at_once() -> None:
    app = Hurtle("memory://")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(retries=2, retry_delay=3600)
    def boom(x: int) -> int:
        raise RuntimeError("boom")

    with eager(app):
        handle = chain(add.s(1, 2), boom.s(), add.s(1)).send()
        with pytest.raises(TaskFailed) as failed:
            handle.result(timeout=0)
        assert failed.value.task == boom.name


def test_what_a_task_sends_runs_before_the_outer_send_returns_on_any_queue() -> None:
    app = _app()
    seen: list[int] = []

    @app.task
    def leaf(n: int) -> None:
        seen.append(n)

    @app.task
    def fan_out(n: int) -> int:
        leaf.options(queue="nobody-names-it").send_many([(i,) for i in range(n)])
        leaf.send(-1)
        return n

    with eager(app) as runs:
        assert fan_out.send(3).result(timeout=0) == 3
        assert sorted(seen) == [-1, 0, 1, 2]
        assert runs.task(leaf).processed == 4


def test_a_send_from_another_thread_during_a_run_is_run_by_that_run() -> None:
    app = _app()

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task
    def outer() -> str:
        ids: list[str] = []
        helper = threading.Thread(target=lambda: ids.append(add.send(20, 22).id))
        helper.start()
        helper.join()  # its send did not wait for this task: the run under way takes it
        return ids[0]

    with eager(app):
        inner = outer.send().result(timeout=0)
        assert app.handle(inner).result(timeout=0) == 42


def test_periodic_tasks_are_not_scheduled_in_eager_mode() -> None:
    app = _app()
    ticks: list[int] = []

    @app.periodic(every=0.01)
    @app.task
    def sweep() -> None:
        ticks.append(1)

    @app.task
    def slow() -> None:
        time.sleep(0.1)  # ten periods: a scheduler would have enqueued some

    with eager(app) as runs:
        slow.send()
        slow.send()
    assert ticks == []
    assert runs.ran == 2


def test_a_rate_limited_task_waits_its_turn_and_every_call_completes() -> None:
    app = _app()

    @app.task(rate_limit="20/s")
    def call_api(n: int) -> int:
        return n

    with eager(app) as runs:
        handles = call_api.send_many([(i,) for i in range(4)])
        assert [h.result(timeout=0) for h in handles] == [0, 1, 2, 3]
    assert (runs.ran, runs.failed) == (4, 0)  # a throttled message counts when it runs


def test_a_time_limit_stops_an_eager_task_on_the_main_thread() -> None:
    assert threading.current_thread() is threading.main_thread()
    app = _app()

    @app.task(time_limit=0.2, retries=0)
    def stuck() -> None:
        time.sleep(60)

    with eager(app):
        with pytest.raises(TaskFailed) as failed:
            stuck.send().result(timeout=0)
        assert failed.value.type == "TimeLimitExceeded"


def test_async_tasks_and_sends_from_a_running_event_loop() -> None:
    app = _app()

    @app.task
    async def add(x: int, y: int) -> int:
        await asyncio.sleep(0)
        return x + y

    async def main() -> int:
        return add.send(2, 2).result(timeout=0)

    with eager(app):
        assert add.send(1, 1).result(timeout=0) == 2
        assert asyncio.run(main()) == 4


def test_unique_tasks_run_once_per_send_when_each_finished_first() -> None:
    app = _app()
    runs: list[str] = []

    @app.task(unique_for=60)
    def reindex(site: str) -> None:
        runs.append(site)

    with eager(app):
        reindex.send("a")
        reindex.send("a")  # the first one finished: its lock is gone
    assert runs == ["a", "a"]


# -- fast-forwarding delayed messages on memory:// ----------------------------------------------


def test_fast_forward_makes_delays_and_retries_due_but_not_what_a_limit_put_back() -> None:
    broker = MemoryBroker()
    now = time.time()
    delayed = Message(id="d", task="t", queue="q", eta=now + 3600, created=now)
    throttled = Message(id="t", task="t", queue="q", created=now)
    broker.publish([delayed, throttled])
    consumer = broker.consumer(["q"])
    [got] = consumer.fetch(10, 0.1)
    consumer.defer(got, now + 3600)  # as a rate limit does: unchanged, due later
    assert broker.stats(["q"])["q"].delayed == 2
    assert broker.fast_forward(["other"]) == 0
    assert broker.fast_forward() == 1
    [ready] = consumer.fetch(10, 0.1)
    assert Message.decode(ready.raw).id == "d"
    stats = broker.stats(["q"])["q"]
    assert (stats.ready, stats.delayed) == (0, 1)
    consumer.close()


# -- drain -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis", "nats"])
def any_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hurtle]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    else:
        url = str(request.getfixturevalue("redis_url"))
    app = Hurtle(url, store_results=True)
    yield app
    app.close()


def test_drain_runs_a_worker_until_the_queues_are_idle_and_says_what_ran(
    any_app: Hurtle,
) -> None:
    app = any_app

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(queue="other", retries=1, retry_delay=0.01)
    def fails() -> None:
        raise ValueError("no")

    handles = add.send_many([(i, i) for i in range(5)])
    later = add.options(delay=0.3).send(10, 10)  # waited for: drain returns after it ran
    failing = fails.send()
    summary = drain(app)
    assert (summary.ran, summary.failed, summary.retried, summary.dead) == (8, 2, 1, 1)
    assert summary.task(add).processed == 6
    assert [h.result(timeout=0) for h in handles] == [0, 2, 4, 6, 8]
    assert later.result(timeout=0) == 20
    assert failing.state() == "dead"
    stats = app.broker.stats(app.queues())
    assert all(s.ready == s.delayed == s.in_flight == 0 for s in stats.values())
    assert stats["other"].dead == 1
    assert drain(app).ran == 0  # nothing left: returns at once


def test_drain_fast_forwards_delays_and_retries_on_memory() -> None:
    app = _app()

    @app.task(retries=2, retry_delay=3600)
    def fails() -> None:
        raise ValueError("no")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    failing = fails.send()
    delayed = add.options(delay=3600).send(1, 2)
    summary = drain(app, fast_forward=True, timeout=30)
    assert (summary.ran, summary.retried, summary.dead) == (4, 2, 1)
    assert failing.state() == "dead"
    assert delayed.result(timeout=0) == 3


def test_drain_past_its_timeout_says_what_is_left() -> None:
    app = _app()

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    add.send(1, 1)
    add.options(delay=3600).send(1, 2)
    with pytest.raises(DrainTimeout) as raised:
        drain(app, timeout=0.3)
    text = str(raised.value)
    assert "default: 0 ready, 1 delayed (the next due in 3" in text
    assert "fast_forward=True" in text
    assert raised.value.summary.ran == 1
    assert isinstance(raised.value, TimeoutError)


def test_drain_gives_up_on_a_task_that_outlives_its_timeout() -> None:
    app = _app()
    release = threading.Event()
    started = threading.Event()

    @app.task
    def stuck() -> None:
        started.set()
        release.wait(30)

    stuck.send()
    try:
        with pytest.raises(DrainTimeout, match="a task is still running"):
            drain(app, timeout=0.3)
        assert started.is_set()
    finally:
        release.set()
    assert drain(app, timeout=30).ran == 0  # the first drain's worker finished it


def test_drain_consumes_the_queues_it_is_given() -> None:
    app = _app()

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    mine = add.options(queue="mine").send(1, 1)
    theirs = add.send(2, 2)
    assert drain(app, queues=["mine"]).ran == 1
    assert mine.state() == "succeeded"
    assert theirs.state() == "pending"


def test_drain_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'q.db'}")
    with pytest.raises(ConfigurationError, match="fast_forward=True works on memory:// only"):
        drain(app, fast_forward=True)
    for timeout in (0, -1, float("nan"), "10"):
        with pytest.raises(ConfigurationError, match="timeout must be"):
            drain(app, timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"queues=\['default'\]"):
        drain(app, queues="default")
    app.close()


# -- the pytest plugin ---------------------------------------------------------------------------

PLUGIN_TESTS = """
import pytest
from hurtle.testing import drain

closed = []

def test_factory_apps_have_stores_of_their_own(hurtle_app_factory):
    a, b = hurtle_app_factory(), hurtle_app_factory(store_results=True)
    assert a.broker is not b.broker and b.settings.store_results
    closed.extend([a, b])

def test_factory_apps_were_closed_after_their_test():
    assert closed and all(app._broker is None for app in closed)

def test_memory_app_runs_tasks_with_drain(hurtle_memory_app):
    app = hurtle_memory_app

    @app.task(store_result=True)
    def double(x):
        return 2 * x

    handle = double.send(21)
    assert drain(app).ran == 1
    assert handle.result(timeout=0) == 42

shared = []

def test_eager_lasts_the_test(hurtle_eager, hurtle_memory_app):
    app = hurtle_memory_app
    shared.append(app)

    @app.task(store_result=True)
    def add(x, y):
        return x + y

    runs = hurtle_eager(app)
    assert add.send(2, 2).result(timeout=0) == 4
    assert runs.ran == 1

def test_eager_ended_with_its_test():
    assert shared[0]._broker is None
"""


def test_the_pytest_plugin_s_fixtures_once_enabled(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["hurtle.testing.pytest_plugin"]')
    pytester.makepyfile(test_plugin=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=5)


def test_the_pytest_plugin_is_not_registered_unless_enabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(hurtle_memory_app):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'hurtle_memory_app' not found*"])
