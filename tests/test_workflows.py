"""Workflows end to end: chains, groups and chords run by real workers.

On the memory broker, workers run in this process; on SQLite and Redis, in processes of their
own, one of them killed with SIGKILL while it runs chord members. Nothing here asserts how long
something took: a chord that fails must raise within the timeout its handle is given.
"""

from __future__ import annotations

import collections
import signal
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import BatchState, Project, workflow_app
from hurtle import ConfigurationError, Hurtle, TaskFailed, chain, chord, group
from hurtle.brokers import FlowStep
from hurtle.flow import FLOW
from hurtle.worker.processor import Processor
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures


@pytest.fixture
def app() -> Hurtle:
    return workflow_app()


def run(app: Hurtle, pool: str = "solo") -> None:
    app.worker(burst=True, pool=pool, concurrency=4, queues=["default", "other"]).run()


def test_a_chain_passes_each_result_as_the_next_tasks_first_argument(app: Hurtle) -> None:
    add, mul = app.tasks["add"], app.tasks["mul"]
    h = chain(add.s(1, 2), add.s(10), mul.s(3)).send()
    one = chain(add.s(5, 6)).send()
    run(app)
    assert h.result(timeout=5) == 39
    assert one.result(timeout=5) == 11


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_group_returns_its_members_results_in_member_order(app: Hurtle, pool: str) -> None:
    add = app.tasks["add"]
    g = group(add.s(i, i) for i in range(100)).send()
    run(app, pool)
    assert g.result(timeout=5) == [2 * i for i in range(100)]


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_chord_calls_its_callback_once_with_the_results_in_member_order(
    app: Hurtle, pool: str
) -> None:
    add, total = app.tasks["add"], app.tasks["total"]
    h = chord(group(add.s(i, 1) for i in range(50)), total.s(offset=1000)).send()
    run(app, pool)
    assert h.result(timeout=5) == sum(range(1, 51)) + 1000
    assert app.calls == [list(range(1, 51))]  # type: ignore[attr-defined]
    assert app.broker.chord_results(h.id, 50) is None  # dropped once the callback was done


def test_signature_options_route_a_link_to_its_queue(app: Hurtle) -> None:
    add, mul = app.tasks["add"], app.tasks["mul"]
    h = chain(add.s(1, 1), mul.s(5).options(queue="other", priority=9)).send()
    app.worker(burst=True, queues=["default"]).run()
    assert app.broker.stats(["other"])["other"].ready == 1  # the next link waits in its queue
    app.worker(burst=True, queues=["other"]).run()
    assert h.result(timeout=5) == 10


def test_a_member_that_fails_for_good_fails_the_chord_at_once_and_its_callback_never_runs(
    app: Hurtle,
) -> None:
    add, boom, total = app.tasks["add"], app.tasks["boom"], app.tasks["total"]
    h = chord([add.s(1, 1), boom.s(7), add.s(2, 2)], total.s()).send()
    run(app)
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=5)
    assert (info.value.task, info.value.type, info.value.message) == (
        "boom",
        "ValueError",
        "boom 7",
    )
    assert "boom[" in str(info.value)
    assert app.calls == []  # type: ignore[attr-defined]
    assert app.broker.stats(["default"])["default"].dead == 1


def test_a_link_that_fails_for_good_fails_the_chain_and_the_rest_never_runs(app: Hurtle) -> None:
    add, boom, mul = app.tasks["add"], app.tasks["boom"], app.tasks["mul"]
    h = chain(add.s(1, 2), boom.s(), mul.s(3)).send()
    run(app)
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=5)
    assert (info.value.task, info.value.message) == ("boom", "boom 3")
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.dead) == (0, 1)


def test_a_member_naming_an_unknown_task_fails_its_workflow(app: Hurtle) -> None:
    other = Hurtle("memory://")
    other._broker = app.broker  # the same store, an app that knows a task the worker does not
    ghost = other.task(name="ghost")(lambda x: x)
    h = chain(ghost.s(1)).send()
    run(app)
    with pytest.raises(TaskFailed, match="unknown task 'ghost'"):
        h.result(timeout=5)


def test_workflows_refuse_calls_that_do_not_fit_before_anything_is_sent(app: Hurtle) -> None:
    add, total = app.tasks["add"], app.tasks["total"]
    with pytest.raises(ConfigurationError, match="do not fit"):
        chain(add.s(1, 2), add.s(1, 2)).send()  # the second gets the first's result too
    with pytest.raises(ConfigurationError, match="do not fit"):
        chord([add.s(1)], total.s()).send()  # sent alone, a member gets nothing before its own
    with pytest.raises(ConfigurationError, match="do not fit"):
        chain(add.s(1, 2), group(add.s(1, 1))).send()  # a member after a step gets its result
    with pytest.raises(ConfigurationError, match="do not fit"):
        group(chain(add.s(1, 2), add.s(1, 2)), add.s(1, 1)).send()
    with pytest.raises(ConfigurationError, match="at least one"):
        chain()
    with pytest.raises(ConfigurationError, match="at least one"):
        chain(add.s(1, 2), group()).send()
    with pytest.raises(ConfigurationError, match="takes signatures"):
        chain(add.s(1, 2), 3)  # type: ignore[arg-type]
    assert app.broker.stats(["default"])["default"].ready == 0


def test_a_chord_of_ten_thousand_members_completes(app: Hurtle) -> None:
    add, total = app.tasks["add"], app.tasks["total"]
    n = 10_000
    h = chord(group(add.s(i, 0) for i in range(n)), total.s()).send()
    run(app)
    assert h.result(timeout=30) == sum(range(n))


def test_an_empty_chord_calls_its_callback_with_no_results(app: Hurtle) -> None:
    h = chord([], app.tasks["total"].s()).send()
    run(app)
    assert h.result(timeout=5) == 0


def test_the_flow_header_is_plain_msgpack_data(app: Hurtle) -> None:
    add = app.tasks["add"]
    chain(add.s(1, 2), add.s(3)).send()
    c = app.broker.consumer(["default"])
    (d,) = c.fetch(1, 1)
    import msgspec

    raw = msgspec.msgpack.decode(d.raw)  # no extension types, nothing to unpickle
    (headers,) = [f for f in raw if isinstance(f, dict) and FLOW in f]
    assert isinstance(headers[FLOW], list)
    c.close()


# -- real processes: SQLite and Redis ---------------------------------------------------------

FLOW_TASKS = textwrap.dedent(
    """
    import os
    import time

    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment
    LOG = os.environ["RUNS_LOG"]


    def record(line):
        with open(LOG, "a") as f:
            f.write(f"{line}\\n")


    @app.task(name="flows.member", retries=0)
    def member(i, seconds):
        record(f"member {i}")
        time.sleep(seconds)
        return i


    @app.task(name="flows.fail", retries=1, retry_delay=0.01)
    def fail(i):
        raise ValueError(f"member {i} fails")


    @app.task(name="flows.total")
    def total(xs):
        record(f"total {len(xs)} {sum(xs)}")
        return sum(xs)
    """
)


@pytest.fixture(params=["sqlite", "redis", "redis-cluster", "nats"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = None
    if request.param == "redis-cluster":
        url = str(request.getfixturevalue("redis_cluster_url"))
    elif request.param != "sqlite":
        url = str(request.getfixturevalue(f"{request.param}_url"))
    p = Project(tmp_path, FLOW_TASKS, ("flows.member", "flows.fail", "flows.total"), url)
    yield p
    p.app.close()


def test_a_chord_with_a_failing_member_raises_within_its_timeout(project: Project) -> None:
    member, fail, total = (
        project.app.tasks[n] for n in ("flows.member", "flows.fail", "flows.total")
    )
    h = chord([member.s(1, 0), fail.s(2), member.s(3, 0)], total.s()).send()
    worker = project.popen("worker", "tasks:app")
    try:
        with pytest.raises(TaskFailed) as info:
            h.result(timeout=60)
        assert (info.value.task, info.value.message) == ("flows.fail", "member 2 fails")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert project.stop(worker) == 0, project.output(worker)
    assert not [r for r in project.runs() if r.startswith("total")]


def test_a_worker_killed_while_it_runs_chord_members_still_leads_to_exactly_one_callback(
    project: Project,
) -> None:
    member, total = project.app.tasks["flows.member"], project.app.tasks["flows.total"]
    n = 300
    h = chord([member.s(i, 0.005) for i in range(n)], total.s()).send()
    env = {"HURTLE_HEARTBEAT_TIMEOUT": "1"}
    victim = project.popen("worker", "tasks:app", **env)
    project.wait_for(lambda: len(project.lines("member")) >= 60)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert victim.returncode == -signal.SIGKILL
    assert not [r for r in project.runs() if r.startswith("total")]
    assert project.status()["default"]["in_flight"] > 0  # it died holding members

    rescuers = [project.popen("worker", "tasks:app", "--burst", **env) for _ in range(2)]
    for rescuer in rescuers:
        assert project.stop(rescuer, timeout=120) == 0, project.output(rescuer)
    assert h.result(timeout=30) == sum(range(n))
    totals = [r for r in project.runs() if r.startswith("total")]
    assert totals == [f"total {n} {sum(range(n))}"]
    ran = collections.Counter(project.lines("member"))
    assert set(ran) == {str(i) for i in range(n)}


def test_chain_handles_are_usable_from_threads(app: Hurtle) -> None:
    add = app.tasks["add"]
    handles = [chain(add.s(i, 1), add.s(1)).send() for i in range(10)]
    got: list[int] = []
    waiters = [threading.Thread(target=lambda h=h: got.append(h.result(10))) for h in handles]
    for w in waiters:
        w.start()
    run(app)
    for w in waiters:
        w.join()
    assert sorted(got) == [i + 2 for i in range(10)]


class _StepsAcker:
    """What a processor hands the acker, kept: workflow steps by hand-off."""

    def __init__(self) -> None:
        self.handed: list[list[FlowStep]] = []

    def ack_flow(self, step: FlowStep) -> None:
        self.handed.append([step])

    def ack_flows(self, steps: list[FlowStep]) -> None:
        self.handed.append(list(steps))


def test_a_batch_of_chord_members_is_handed_on_at_once_with_one_callback_message(
    app: Hurtle,
) -> None:
    add, total = app.tasks["add"], app.tasks["total"]
    h = chord(group(add.s(i, 1) for i in range(30)), total.s()).send()
    consumer = app.broker.consumer(["default"], "w1")
    batch = consumer.fetch(100, 1.0)
    acker = _StepsAcker()
    processor = Processor(app, acker)  # type: ignore[arg-type]
    processor.process_many(batch, BatchState())
    [steps] = acker.handed  # the members of a batch: one hand-off, one ack_flow call
    assert [s.delivery for s in steps] == batch
    assert [s.chord.index for s in steps if s.chord is not None] == list(range(30))
    callbacks = {id(s.chord.callback) for s in steps if s.chord is not None}
    assert len(callbacks) == 1  # made once for the chord, not once per member
    assert steps[0].chord is not None and steps[0].chord.callback.id == h.id
    assert processor.tally.snapshot() == {("default", "add"): (30, 0, 0, 0)}
