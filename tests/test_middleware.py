"""Middleware: registration on the app, hooks on both sides and on batches, per-task pipelines,
deferral, retries as the built-in failure policy; memory broker, plus one real worker process."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from helpers import BatchState, Project
from hurtle import ConfigurationError, Hurtle, HurtleError, Message, Reject, TaskFailed
from hurtle.brokers import Delivery
from hurtle.middleware import Calls, Middleware, Outcome
from hurtle.middleware.retries import Retries
from hurtle.task import Task
from hurtle.worker import Worker
from hurtle.worker.processor import CALLS_CHUNK, Job, Processor


class Recorder(Middleware):
    """Records every hook call, for tasks whose name ends with one of ``suffixes``."""

    def __init__(self, *suffixes: str) -> None:
        self.suffixes = suffixes
        self.asked: list[str] = []
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def _add(self, hook: str, what: Any) -> None:
        with self.lock:
            self.calls.append((hook, what))

    def applies_to(self, task: Task[Any, Any]) -> bool:
        self.asked.append(task.name)
        return task.name.endswith(self.suffixes) if self.suffixes else True

    def worker_start(self, worker: Worker) -> None:
        self._add("worker_start", worker.consumer is not None and worker.acker is not None)

    def worker_stop(self, worker: Worker) -> None:
        self._add("worker_stop", None)

    def before_batch(self, jobs: list[Job]) -> None:
        self._add("before_batch", [j.message.args for j in jobs])

    def before_process(self, job: Job) -> None:
        self._add("before_process", job.message.args)

    def after_process(self, job: Job, result: Any, error: BaseException | None) -> None:
        self._add("after_process", (job.message.args, result, type(error).__name__))

    def after_batch(self, jobs: list[Job]) -> None:
        self._add("after_batch", [j.message.args for j in jobs])

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        self._add("after_outcome", (job.message.args, outcome.kind, outcome.result))

    def hooks(self, name: str) -> list[Any]:
        return [what for hook, what in self.calls if hook == name]


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)


def test_app_middleware_runs_in_its_workers_in_order_after_the_builtins(app: Hurtle) -> None:
    first, second = Recorder(), Recorder()
    app = Hurtle("memory://", middleware=[first])
    app.add_middleware(second)
    assert app.middleware[0] is app._builtin_middleware()[0]
    assert isinstance(app.middleware[0], Retries)
    assert app.middleware[1:] == [first, second]

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    add.send(5, 6)
    extra = Recorder()
    app.worker(burst=True, middleware=[extra]).run()
    for m in (first, second, extra):
        assert m.hooks("after_outcome") == [((5, 6), "ack", 11)]
        assert m.hooks("worker_start") == [True]
        assert m.hooks("worker_stop") == [None]


def test_adding_something_that_is_not_a_middleware_is_refused_with_what_to_do() -> None:
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match="subclass Middleware"):
        app.add_middleware(object())  # type: ignore[arg-type]


def test_a_task_no_middleware_applies_to_stays_inline_and_sees_no_hook(app: Hurtle) -> None:
    rec = Recorder(".featured")
    app.add_middleware(rec)
    seen: list[str] = []

    @app.task(name="t.plain", retries=3)  # a retry budget alone keeps the inline path
    def plain(i: int) -> None:
        seen.append(f"plain {i}")

    @app.task(name="t.featured")
    def featured(i: int) -> None:
        seen.append(f"featured {i}")

    plain.send_many([(i,) for i in range(50)])
    featured.send_many([(i,) for i in range(50)])
    worker = app.worker(burst=True)
    worker.run()
    assert len(seen) == 100
    assert worker.processor is not None
    assert worker.processor.pipeline("t.plain").inline  # type: ignore[union-attr]
    assert not worker.processor.pipeline("t.featured").inline  # type: ignore[union-attr]
    assert sorted(a[0] for a in rec.hooks("before_process")) == list(range(50))
    assert sorted(a[0][0] for a in rec.hooks("after_outcome")) == list(range(50))
    batched = [args for batch in rec.hooks("before_batch") for args in batch]
    assert sorted(a[0] for a in batched) == list(range(50))
    after = [args for batch in rec.hooks("after_batch") for args in batch]
    assert sorted(a[0] for a in after) == list(range(50))


def test_applies_to_is_asked_once_per_task_never_per_message(app: Hurtle) -> None:
    rec = Recorder()
    app.add_middleware(rec)

    @app.task(name="t.a")
    def a() -> None:
        pass

    a.send_many([() for _ in range(300)])
    app.worker(burst=True).run()
    assert rec.asked == ["t.a"]


def test_before_batch_hooks_run_before_any_job_of_the_batch(app: Hurtle) -> None:
    order: list[str] = []

    class Gate(Middleware):
        def before_batch(self, jobs: list[Job]) -> None:
            order.append(f"batch of {len(jobs)}")

    app.add_middleware(Gate())

    @app.task
    def step(i: int) -> None:
        order.append(f"run {i}")

    step.send_many([(i,) for i in range(3)])
    app.worker(burst=True).run()
    assert order == ["batch of 3", "run 0", "run 1", "run 2"]


def test_a_deferred_job_is_not_run_and_comes_back_later_with_the_same_attempt(
    app: Hurtle,
) -> None:
    deferred_once: set[str] = set()
    kinds: list[tuple[int, str]] = []

    class Throttle(Middleware):
        def before_batch(self, jobs: list[Job]) -> None:
            for job in jobs:
                if job.message.id not in deferred_once:
                    deferred_once.add(job.message.id)
                    job.defer(0.05, "throttled")
                    assert job.deferred

        def after_outcome(self, job: Job, outcome: Outcome) -> None:
            kinds.append((job.message.args[0], outcome.kind))

    app.add_middleware(Throttle())
    runs: list[tuple[int, int]] = []

    @app.task(retries=0)
    def work(i: int) -> None:
        runs.append((i, 0))

    work.send_many([(1,), (2,)])
    worker = app.worker(burst=True)
    worker.run()
    assert sorted(runs) == [(1, 0), (2, 0)]  # each ran once, after its deferral
    assert sorted(kinds) == [(1, "ack"), (1, "deferred"), (2, "ack"), (2, "deferred")]
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)


def test_admit_decides_a_batch_from_counts_and_the_last_ones_come_back_later(
    app: Hurtle,
) -> None:
    asked: list[dict[str, int]] = []
    alone: list[int] = []

    class FirstTwo(Middleware):
        """Admits two calls of each batch; a job met alone goes through before_batch."""

        def applies_to(self, task: Task[Any, Any]) -> bool:
            return task.name.endswith("work")

        def before_batch(self, jobs: list[Job]) -> None:
            alone.append(len(jobs))

        def admit(self, counts: dict[Task[Any, Any], int]) -> dict[str, Any]:
            asked.append({t.name: n for t, n in counts.items()})
            return {t.name: (2, 0.05, 0.01, "two at a time") for t, n in counts.items() if n > 2}

    app.add_middleware(FirstTwo())
    runs: list[int] = []

    @app.task(name="work", retries=0)
    def work(i: int) -> None:
        runs.append(i)

    @app.task(name="other")
    def other(i: int) -> None:
        runs.append(100 + i)

    work.send_many([(i,) for i in range(5)])
    other.send_many([(i,) for i in range(3)])
    app.worker(burst=True).run()
    assert asked[0] == {"work": 5}  # once for the batch, with the count: no job per message
    assert runs[:2] == [0, 1] and sorted(runs) == [0, 1, 2, 3, 4, 100, 101, 102]
    assert alone == []  # in a batch, admit stands for before_batch
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)


def test_consumer_defer_puts_the_message_back_unchanged_due_later(app: Hurtle) -> None:
    @app.task
    def work() -> None:
        pass

    message_id = work.send().id
    consumer = app.broker.consumer(["default"], "w1")
    (delivery,) = consumer.fetch(10, 0.1)
    consumer.defer(delivery, time.time() + 0.05)
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.delayed, stats.in_flight) == (0, 1, 0)
    deadline = time.monotonic() + 10
    again: list[Any] = []
    while not again and time.monotonic() < deadline:
        again = consumer.fetch(10, 0.1)
    (back,) = again
    message = Message.decode(back.raw)
    assert (message.id, message.attempt) == (message_id, 0)
    consumer.close()


def test_outcome_kinds_for_success_retry_and_dead_letter(app: Hurtle) -> None:
    rec = Recorder()
    app.add_middleware(rec)

    @app.task(retries=1)
    def flaky(i: int) -> int:
        if i:
            raise ValueError("no")
        return 7

    @app.task(retries=3)
    def refused() -> None:
        raise Reject("bad input")

    flaky.send(0)
    flaky.send(1)
    refused.send()
    app.worker(burst=True).run()
    outcomes = [(args, kind) for args, kind, _ in rec.hooks("after_outcome")]
    assert sorted(map(str, outcomes)) == sorted(
        map(
            str,
            [
                ((0,), "ack"),
                ((1,), "retry"),
                ((1,), "dead"),
                ((), "dead"),
            ],
        )
    )
    assert ((0,), "ack", 7) in rec.hooks("after_outcome")
    reasons = sorted(d.reason.splitlines()[0] for d in app.broker.dead_letters("default"))
    assert reasons[0].startswith("rejected by task")
    assert "failed on attempt 2 of 2" in reasons[1]


def test_before_process_may_reject_a_call_as_before(app: Hurtle) -> None:
    class Guard(Middleware):
        def before_process(self, job: Job) -> None:
            raise Reject("not today")

    app.add_middleware(Guard())
    ran: list[int] = []

    @app.task(retries=2)
    def work() -> None:
        ran.append(1)

    work.send()
    app.worker(burst=True).run()
    assert ran == []
    (dead,) = app.broker.dead_letters("default")
    assert "not today" in dead.reason


def test_before_publish_may_add_headers_once_per_batch(app: Hurtle) -> None:
    batches: list[int] = []

    class Stamp(Middleware):
        def before_publish(self, messages: list[Message]) -> list[Message]:
            batches.append(len(messages))
            return [
                msgspec.structs.replace(m, headers={**m.headers, "stamp": "yes"}) for m in messages
            ]

    app.add_middleware(Stamp())
    seen: list[str] = []

    @app.task
    def work(i: int) -> None:
        pass

    work.send(1)
    work.send_many([(i,) for i in range(5)])
    work.options(priority=3).send(2)
    work.options(priority=3).send_many([(3,), (4,)])
    assert batches == [1, 5, 1, 2]
    consumer = app.broker.consumer(["default"], "w1")
    deliveries = consumer.fetch(100, 0.1)
    seen = [Message.decode(d.raw).headers["stamp"] for d in deliveries]
    assert seen == ["yes"] * 9
    consumer.close()


def test_before_publish_may_refuse_a_batch_and_nothing_is_published(app: Hurtle) -> None:
    class Refuse(Middleware):
        def before_publish(self, messages: list[Message]) -> list[Message]:
            raise HurtleError("refused")

    app.add_middleware(Refuse())

    @app.task
    def work(i: int) -> None:
        pass

    with pytest.raises(HurtleError, match="refused"):
        work.send(1)
    with pytest.raises(HurtleError, match="refused"):
        work.send_many([(1,), (2,)])
    assert app.broker.stats(["default"])["default"].ready == 0


def test_a_failing_hook_is_logged_and_the_outcome_still_recorded(app: Hurtle) -> None:
    class Broken(Middleware):
        def after_process(self, job: Job, result: Any, error: BaseException | None) -> None:
            raise RuntimeError("oops")

        def after_batch(self, jobs: list[Job]) -> None:
            raise RuntimeError("oops")

    app.add_middleware(Broken())
    ran: list[int] = []

    @app.task
    def work() -> None:
        ran.append(1)

    work.send()
    app.worker(burst=True).run()
    assert ran == [1]
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_hooks_run_in_other_pools_too(app: Hurtle, pool: str) -> None:
    rec = Recorder()
    app.add_middleware(rec)

    @app.task
    def work(i: int) -> int:
        return i

    work.send_many([(i,) for i in range(20)])
    app.worker(burst=True, pool=pool, concurrency=4).run()
    assert sorted(a[0][0] for a in rec.hooks("after_outcome")) == list(range(20))
    assert sorted(a[0] for batch in rec.hooks("before_batch") for a in batch) == list(range(20))
    assert sorted(a[0] for batch in rec.hooks("after_batch") for a in batch) == list(range(20))


TASKS = """
import os
from hurtle import Hurtle
from hurtle.middleware import Middleware

class Count(Middleware):
    def __init__(self):
        self.seen = 0

    def after_batch(self, jobs):
        self.seen += len(jobs)

    def worker_stop(self, worker):
        with open(os.environ["RUNS_LOG"], "a") as f:
            f.write(f"counted {self.seen}\\n")

app = Hurtle(middleware=[Count()])

@app.task(name="tasks.add")
def add(x, y):
    return x + y
"""


def test_hurtle_worker_runs_the_apps_middleware(tmp_path: Path) -> None:
    p = Project(tmp_path, TASKS, ("tasks.add",))
    p.send_many("tasks.add", [(i, i) for i in range(25)])
    out = p.hurtle("worker", "tasks:app", "--burst")
    assert out.returncode == 0, out.stderr
    assert p.runs() == ["counted 25"]
    p.app.close()


def test_the_guide_middleware_example_counts_and_logs_every_ten_thousand(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    readme = (Path(__file__).parent.parent / "docs" / "middleware.md").read_text()
    block = next(
        b.split("\n", 1)[1] for b in readme.split("```python")[1:] if "class Count(Middleware)" in b
    ).split("```")[0]
    monkeypatch.setenv("HURTLE_BROKER_URL", "memory://")
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/middleware.md", "exec"), namespace)
    app: Hurtle = namespace["app"]

    @app.task(name="t.noop")
    def noop() -> None:
        pass

    noop.send_many([()] * 20_000)
    with caplog.at_level("INFO", logger="count"):
        app.worker(burst=True).run()
    assert [r.getMessage() for r in caplog.records if r.name == "count"] == [
        "t.noop: 10000 done",
        "t.noop: 20000 done",
    ]


def test_middleware_added_after_the_worker_was_made_still_runs_in_it(app: Hurtle) -> None:
    @app.task
    def work() -> None:
        pass

    work.send()
    worker = app.worker(burst=True)
    late = Recorder()
    app.add_middleware(late)
    worker.run()
    assert [kind for _, kind, _ in late.hooks("after_outcome")] == ["ack"]


class EvenOnly(Middleware):
    """``after_calls``: fails the calls that returned an odd number; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[Any], list[Any]]] = []
        self.outcomes: list[tuple[Any, str]] = []

    def after_calls(self, calls: Calls) -> None:
        self.seen.append((calls.task.name, [m.args for m in calls.messages], list(calls.results)))
        for i, result in enumerate(calls.results):
            if result % 2:
                calls.fail(i, Reject(f"odd result {result}"))

    def after_outcome(self, job: Job, outcome: Outcome) -> None:
        self.outcomes.append((job.message.args, outcome.kind))


@pytest.mark.parametrize("pool", ["solo", "threads", "asyncio"])
def test_after_calls_sees_returned_calls_in_columns_and_may_fail_some(
    app: Hurtle, pool: str
) -> None:
    m = EvenOnly()
    app.add_middleware(m)

    @app.task(name="t.double")
    def double(i: int) -> int:
        return 2 * i

    @app.task(name="t.same")
    def same(i: int) -> int:
        return i

    double.send_many([(i,) for i in range(20)])
    same.send_many([(i,) for i in range(20)])
    worker = app.worker(pool=pool, burst=True)
    worker.run()
    assert worker.processor is not None
    pipeline = worker.processor.pipeline("t.same")
    assert pipeline is not None and not pipeline.per_call  # the batch path calls it
    seen: dict[str, tuple[list[Any], list[Any]]] = {"t.double": ([], []), "t.same": ([], [])}
    for name, args, results in m.seen:
        seen[name][0].extend(args)
        seen[name][1].extend(results)
    assert sorted(seen["t.double"][0]) == [(i,) for i in range(20)]
    assert sorted(seen["t.same"][1]) == list(range(20))
    # acknowledgements are seen in after_calls only; the failed calls reach after_outcome
    assert sorted(m.outcomes) == sorted(((i,), "dead") for i in range(1, 20, 2))
    stats = app.broker.stats(["default"])["default"]
    assert (stats.dead, stats.ready, stats.in_flight) == (10, 0, 0)


class Parts(Middleware):
    """``after_calls``: records each part it is shown (task, queues, first arguments)."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, set[str], list[int]]] = []

    def after_calls(self, calls: Calls) -> None:
        self.parts.append(
            (
                calls.task.name,
                {d.queue for d in calls.deliveries},
                [m.args[0] for m in calls.messages],
            )
        )


class _Acks:
    def __init__(self) -> None:
        self.acked: list[Delivery] = []
        self.dead: list[str] = []  # their reasons

    def ack_many(self, deliveries: list[Delivery]) -> None:
        self.acked += deliveries

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.dead.append(reason)


def test_after_calls_sees_a_long_batch_in_parts_of_one_queue_each(app: Hurtle) -> None:
    # a batch's calls are settled in parts of at most CALLS_CHUNK (while they are still in the
    # CPU's cache), each of one task and one queue; a run whose calls all raised shows nothing
    m = Parts()
    app.add_middleware(m)

    @app.task(name="t.echo", retries=0)
    def echo(i: int) -> int:
        if i < 0:
            raise ValueError(i)
        return i

    def delivery(queue: str, i: int) -> Delivery:
        return Delivery(queue, echo.message((i,), {}).encode(), 0)

    batch = (
        [delivery("a", i) for i in range(300)]
        + [delivery("b", i) for i in range(300, 310)]
        + [delivery("a", i) for i in range(310, 400)]
        + [delivery("c", -1), delivery("c", -2)]
    )
    acks = _Acks()
    processor = Processor(app, acks, app.worker().middleware)  # type: ignore[arg-type]
    processor.process_many(batch, BatchState())

    assert all(0 < len(args) <= CALLS_CHUNK for _, _, args in m.parts)
    assert all(len(queues) == 1 for _, queues, _ in m.parts)
    by_queue: dict[str, list[int]] = {}
    for _, (queue,), args in m.parts:
        by_queue.setdefault(queue, []).extend(args)
    assert by_queue == {"a": list(range(300)) + list(range(310, 400)), "b": list(range(300, 310))}
    assert sorted(d.queue for d in acks.acked) == ["a"] * 390 + ["b"] * 10
    assert len(acks.dead) == 2 and all("ValueError" in r for r in acks.dead)


def test_a_call_that_overran_is_failed_when_its_part_is_settled_mid_batch(app: Hurtle) -> None:
    # the call that fills a part returned after its executor marked it overran (it swallowed
    # the interruption): the part settled in the middle of the batch fails it, acknowledges
    # the others, and the batch's end does not count it again
    m = Parts()
    app.add_middleware(m)
    state = BatchState()

    @app.task(name="t.stubborn", retries=0, time_limit=30)
    def stubborn(i: int) -> int:
        if i == CALLS_CHUNK - 1:
            assert state.current is not None
            state.overran.append(state.current)  # as the solo pool's watchdog does
        return i

    batch = [Delivery("q", stubborn.message((i,), {}).encode(), 0) for i in range(200)]
    acks = _Acks()
    processor = Processor(app, acks, app.worker().middleware, inline_limits=True)  # type: ignore[arg-type]
    processor.process_many(batch, state)

    assert [len(args) for _, _, args in m.parts] == [CALLS_CHUNK, 200 - CALLS_CHUNK]
    (reason,) = acks.dead
    assert "TimeLimitExceeded" in reason and "time limit of 30s" in reason
    assert len(acks.acked) == 199
    assert batch[CALLS_CHUNK - 1] not in acks.acked


class Fussy(Middleware):
    """``after_calls`` that raises on any part holding a call that returned ``bad``."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def applies_to(self, task: Task[Any, Any]) -> bool:
        return True

    def after_calls(self, calls: Calls) -> None:
        if self.bad in calls.results:
            raise RuntimeError(f"cannot take {self.bad}")


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_hook_failing_in_after_calls_fails_only_the_calls_it_fails_on_alone(
    app: Hurtle, pool: str
) -> None:
    # the hook raises on the whole part: each call is settled alone, so the one it cannot
    # take fails (here dead-lettered, with its failure record) and the others keep their
    # results; none is acknowledged without what the hooks record
    app.add_middleware(Fussy(13))

    @app.task(store_result=True, retries=0)
    def echo(i: int) -> int:
        return i

    handles = echo.send_many([(i,) for i in range(41)])
    app.worker(pool=pool, burst=True).run()
    with pytest.raises(TaskFailed, match="cannot take 13"):
        handles[13].result(timeout=1)
    assert [h.result(timeout=1) for h in handles if h is not handles[13]] == [
        i for i in range(41) if i != 13
    ]
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 1)
