"""Celery's spellings of results, signatures, workflows and sending by name: each works with its
hurtle meaning, or is refused with one line that says what to write instead.

Workers run in this process on the memory broker; each test waits on results, never on time.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hurtle import (
    ArgumentError,
    ConfigurationError,
    Hurtle,
    ResultTimeout,
    TaskFailed,
    chain,
    chord,
    group,
)
from hurtle.brokers.memory import MemoryBroker
from hurtle.errors import ResultError
from hurtle.handles import CELERY_STATES, State
from hurtle.message import Message
from hurtle.worker import Worker


@pytest.fixture
def app() -> Iterator[Hurtle]:
    app = Hurtle("memory://", store_results=True, default_retry_delay=0.01)

    @app.task(name="tasks.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="tasks.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="tasks.tsum")
    def tsum(numbers: list[int]) -> int:
        return sum(numbers)

    @app.task(name="tasks.boom", retries=0)
    def boom() -> None:
        raise ValueError("boom")

    @app.task(name="tasks.later", retries=1, retry_delay=3600)
    def later() -> None:
        raise ValueError("again in an hour")

    yield app
    for worker in workers.pop(app, []):
        worker.stop()
    app.close()


workers: dict[Hurtle, list[Worker]] = {}


def start(app: Hurtle) -> Worker:
    """Run a worker of ``app`` in a thread until the test ends."""
    worker = app.worker(concurrency=1)
    worker.run_in_thread()
    workers.setdefault(app, []).append(worker)
    return worker


def _waiting(app: Hurtle, queues: list[str] | None = None) -> list[Message]:
    """The messages ready in ``queues`` (default: every queue the broker knows), left there."""
    consumer = app.broker.consumer(queues or app.broker.queues() or ["default"])
    got = consumer.fetch(10_000, 0)
    consumer.release(got)
    return [Message.decode(d.raw) for d in got]


# -- handles ---------------------------------------------------------------------------------


def test_get_ready_successful_failed_and_status_read_a_handle_as_celery_does(app: Hurtle) -> None:
    add, boom = app.tasks["tasks.add"], app.tasks["tasks.boom"]
    h = add.delay(2, 3)
    assert (h.ready(), h.successful(), h.failed(), h.status, h.state) == (
        False,
        False,
        False,
        "PENDING",
        "PENDING",
    )
    failing = boom.delay()
    start(app)
    assert h.get(timeout=10) == 5
    assert h.get() == 5  # no timeout: as long as it takes, as Celery's
    assert (h.ready(), h.successful(), h.failed(), h.status) == (True, True, False, "SUCCESS")
    with pytest.raises(TaskFailed, match="ValueError: boom"):
        failing.get(timeout=10)
    returned = failing.get(timeout=10, propagate=False)
    assert isinstance(returned, TaskFailed) and returned.type == "ValueError"
    assert (failing.ready(), failing.successful(), failing.failed()) == (True, False, True)
    assert failing.status == failing.state == "FAILURE"


def test_state_is_celerys_name_and_called_still_hurtles(app: Hurtle) -> None:
    h = app.tasks["tasks.add"].delay(1, 1)
    start(app)
    h.get(timeout=10)
    state = h.state
    assert isinstance(state, str) and isinstance(state, State)
    assert state == "SUCCESS" and state in ("SUCCESS", "FAILURE") and f"{state}" == "SUCCESS"
    assert h.state() == "succeeded"  # hurtle's spelling is unchanged
    assert pickle.loads(pickle.dumps(state))() == "succeeded"
    assert set(CELERY_STATES.values()) == {
        "PENDING",
        "STARTED",
        "SUCCESS",
        "RETRY",
        "FAILURE",
        "REVOKED",
    }


def test_a_retry_scheduled_reads_retry_and_cancelled_or_expired_read_revoked(
    app: Hurtle,
) -> None:
    later, add = app.tasks["tasks.later"], app.tasks["tasks.add"]
    retrying = later.delay()
    cancelled = add.delay(1, 2)
    app.cancel(cancelled)
    expired = add.apply_async((1, 2), expires=0)
    start(app)
    for h, hurtle in ((cancelled, "cancelled"), (expired, "expired")):
        with pytest.raises(TaskFailed):
            h.get(timeout=10)
        assert (h.status, h.state(), h.ready(), h.failed()) == ("REVOKED", hurtle, True, False)
    with pytest.raises(ResultTimeout):  # the next attempt is an hour away
        retrying.get(timeout=0.2)
    assert (retrying.status, retrying.state(), retrying.ready()) == ("RETRY", "failed", False)


def test_a_handle_of_a_task_without_results_says_how_to_keep_them(app: Hurtle) -> None:
    @app.task(name="tasks.quiet", ignore_result=True)
    def quiet() -> None: ...

    h = quiet.delay()
    for read in (lambda: h.get(timeout=1), h.ready, lambda: h.status):
        with pytest.raises(ResultError, match=r"store_result=True"):
            read()


def test_a_group_handle_gets_and_reads_its_members_as_celery_does(app: Hurtle) -> None:
    add, boom = app.tasks["tasks.add"], app.tasks["tasks.boom"]
    start(app)
    g = group(add.s(i, i) for i in range(4))()
    assert g.get(timeout=10) == [0, 2, 4, 6]
    assert (g.ready(), g.successful(), g.failed()) == (True, True, False)
    bad = group(add.s(1, 1), boom.s())()
    with pytest.raises(TaskFailed):
        bad.get(timeout=10)
    assert (bad.ready(), bad.successful(), bad.failed()) == (True, False, True)


def test_app_async_result_rebuilds_a_handle_from_its_id(app: Hurtle) -> None:
    start(app)
    sent = app.tasks["tasks.add"].delay(20, 22)
    again = app.AsyncResult(sent.id)
    assert again == sent and again.get(timeout=10) == 42 and again.status == "SUCCESS"


# -- signatures and workflows -----------------------------------------------------------------


def test_a_signature_is_sent_by_delay_and_apply_async_and_run_here_when_called(
    app: Hurtle,
) -> None:
    add = app.tasks["tasks.add"]
    start(app)
    assert add.s(1, 2).delay().get(timeout=10) == 3
    assert add.s(1).delay(10).get(timeout=10) == 11  # Celery puts the given arguments first
    assert add.s(x=1).delay(y=5).get(timeout=10) == 6
    assert add.s(1, 2).apply_async(countdown=0.05).get(timeout=10) == 3
    assert add.s(2).apply_async((40,)).get(timeout=10) == 42
    assert add.s(2)(1) == 3  # calling a signature runs the task here, as calling a task does


def test_signature_and_set_take_celerys_options(app: Hurtle) -> None:
    add = app.tasks["tasks.add"]
    sig = add.signature((1, 2), countdown=600, queue="slow", priority=7)
    assert (sig.args, sig.kwargs) == ((1, 2), {})
    assert sig.opts is not None and (sig.opts.delay, sig.opts.queue, sig.opts.priority) == (
        600,
        "slow",
        7,
    )
    same = sig.set(queue="fast", expires=60)
    assert same is sig and sig.opts is not None
    assert (sig.opts.queue, sig.opts.delay, sig.opts.expires) == ("fast", 600, 60)
    assert add.signature(kwargs={"x": 1, "y": 2}).kwargs == {"x": 1, "y": 2}
    sig.delay()
    assert app.broker.stats(["fast"])["fast"].delayed == 1
    add.signature((3, 4), queue="fast", priority=7).delay()
    (sent,) = _waiting(app, ["fast"])
    assert (sent.queue, sent.priority, sent.args) == ("fast", 7, (3, 4))


def test_the_pipe_operator_builds_chains_and_a_group_piped_to_a_signature_is_a_chord(
    app: Hurtle,
) -> None:
    add, mul, tsum = (app.tasks[n] for n in ("tasks.add", "tasks.mul", "tasks.tsum"))
    start(app)
    pipe = add.s(1, 2) | mul.s(10)
    assert isinstance(pipe, chain)
    assert pipe().get(timeout=10) == 30
    assert (pipe | add.s(1)).delay().get(timeout=10) == 31
    assert (add.s(1, 1) | (mul.s(3) | add.s(1))).apply_async().get(timeout=10) == 7
    assert (pipe | chain(add.s(5), mul.s(2))).delay().get(timeout=10) == 70
    piped = group(add.s(i, i) for i in range(3)) | tsum.s()
    assert isinstance(piped, chord)
    assert piped().get(timeout=10) == 6


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda add, tsum: add.s(1, 2) | group(add.s(1), add.s(2)), [4, 5]),
        (lambda add, tsum: chain(add.s(1, 2)) | chord([add.s(1), add.s(2)], tsum.s()), 9),
        (lambda add, tsum: group(add.s(1, 1), add.s(2, 2)) | chain(tsum.s(), add.s(1)), 7),
        (lambda add, tsum: chord([add.s(1, 1)], tsum.s()) | group(add.s(1), add.s(2)), [3, 4]),
    ],
    ids=["sig|group", "chain|chord", "group|chain", "chord|group"],
)
def test_piping_into_a_group_or_chord_builds_a_nested_workflow(
    app: Hurtle, build: Callable[..., Any], expected: object
) -> None:
    start(app)
    workflow = build(app.tasks["tasks.add"], app.tasks["tasks.tsum"])
    assert workflow.delay().get(timeout=10) == expected


def test_chains_groups_and_chords_are_sent_by_calling_them(app: Hurtle) -> None:
    add, mul, tsum = (app.tasks[n] for n in ("tasks.add", "tasks.mul", "tasks.tsum"))
    start(app)
    assert chain(add.s(1, 2), mul.s(3))().get(timeout=10) == 9
    assert chain(add.s(1, 2), mul.s(3)).delay().get(timeout=10) == 9
    assert chain(add.s(1, 2), mul.s(3)).apply_async().get(timeout=10) == 9
    assert chain(add.s(2), mul.s(3))(1).get(timeout=10) == 9  # given to the first step
    assert chain(add.s(2), mul.s(3)).apply_async((5,)).get(timeout=10) == 21
    assert group(add.s(i, i) for i in range(3))().get(timeout=10) == [0, 2, 4]
    assert group(add.s(i) for i in range(3))(10).get(timeout=10) == [10, 11, 12]
    assert group(add.s(1, 1), add.s(2, 2)).delay().get(timeout=10) == [2, 4]
    assert group([add.s(1)]).apply_async((1,)).get(timeout=10) == [2]
    assert chord([add.s(i, 1) for i in range(4)])(tsum.s()).get(timeout=10) == 10
    assert chord(group(add.s(1, 1)), tsum.s())().get(timeout=10) == 2
    assert chord([add.s(1, 1)], tsum.s()).delay().get(timeout=10) == 2
    assert chord([add.s(2, 2)], tsum.s()).apply_async().get(timeout=10) == 4


def test_workflow_sends_refuse_options_and_missing_parts_saying_what_to_write(
    app: Hurtle,
) -> None:
    add, tsum = app.tasks["tasks.add"], app.tasks["tasks.tsum"]
    refusals: list[tuple[Callable[[], object], str]] = [
        (lambda: chain(add.s(1, 2)).apply_async(countdown=5), r"set\(countdown=10\)"),
        (lambda: group(add.s(1, 2))(queue="x"), "set them on its signatures"),
        (lambda: chord([add.s(1, 2)])(tsum.s(), priority=1), "takes no options"),
        (lambda: chord([add.s(1, 2)])(), r"needs a callback: .*chord\(header\)\(total.s\(\)\)"),
        (lambda: chain(add.s(1)).delay(), "do not fit"),  # still checked when sent
        (lambda: add.s(1, 2).apply_async(link=add.s(3)), r"add.s\(1, 2\) \| mul.s\(3\)"),
        (lambda: add.s(1, 2).set(routing_key="x"), "give queue="),
        (lambda: add.signature((1, 2), task_id="mine"), r"h\.id"),
        (lambda: add.s(1, 2).set(priority=10), "priority"),
        (lambda: add.s(1, 2).apply_async("12"), "args must be a tuple or list"),
    ]
    for call, match in refusals:
        with pytest.raises(ConfigurationError, match=match) as info:
            call()
        assert "\n" not in str(info.value)
    assert _waiting(app) == []


# -- send_task --------------------------------------------------------------------------------


def test_send_task_sends_a_registered_task_by_name_with_its_checks(app: Hurtle) -> None:
    start(app)
    h = app.send_task("tasks.add", args=(1, 2), kwargs={})
    assert h.task is app.tasks["tasks.add"] and h.get(timeout=10) == 3
    assert app.send_task("tasks.add", kwargs={"x": 2, "y": 2}, countdown=0.05).get(timeout=10) == 4
    with pytest.raises(ArgumentError, match="do not fit"):
        app.send_task("tasks.add", args=(1,))


def test_send_task_sends_another_services_task_that_this_app_does_not_register() -> None:
    broker = MemoryBroker()
    client, service = Hurtle(broker, store_results=True), Hurtle(broker, store_results=True)

    @service.task(name="billing.charge", queue="billing")
    def charge(account: str, cents: int) -> str:
        return f"{account}:{cents}"

    assert "billing.charge" not in client.tasks
    h = client.send_task(
        "billing.charge", args=("acme",), kwargs={"cents": 250}, queue="billing", priority=9
    )
    worker = start(service)
    try:
        assert client.AsyncResult(h.id).get(timeout=10) == "acme:250"
        assert h.get(timeout=10) == "acme:250" and h.status == "SUCCESS"
        delayed = client.send_task("billing.charge", ("b", 1), countdown=600, queue="billing")
        assert delayed.status == "PENDING"
    finally:
        worker.stop()
        workers.pop(service)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"priority": 10}, "priority"),
        ({"queue": "no spaces"}, "queue"),
        ({"countdown": -1}, "delay must be >= 0"),
        ({"expires": "soon"}, "expires must be a number"),
        ({"headers": {1: 2}}, "str keys"),
        ({"link": "x"}, r"add.s\(1, 2\) \| mul.s\(3\)"),
        ({"serializer": "json"}, "MessagePack"),
        ({"retry": True}, "BrokerError"),
        ({"args": "12"}, "args must be a tuple or list"),
        ({"kwargs": [("x", 1)]}, "kwargs must be a dict"),
        ({"kwargs": {1: 2}}, "kwargs must have str keys"),
    ],
)
def test_send_task_of_an_unregistered_name_checks_options_as_send_does(
    options: dict[str, Any], match: str
) -> None:
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match=match) as info:
        app.send_task("other.service.task", **options)
    assert "\n" not in str(info.value) and "other.service.task" in str(info.value)
    assert _waiting(app) == []


def test_send_task_refuses_a_name_that_is_no_task_name() -> None:
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match="must not be empty"):
        app.send_task("")
    with pytest.raises(ConfigurationError, match="must be a str"):
        app.send_task(42)  # type: ignore[arg-type]
