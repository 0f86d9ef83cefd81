"""Tasks and sending, on the memory broker."""

from __future__ import annotations

import time

import pytest

from hurtle import Args, ConfigurationError, EncodeError, Hurtle, Message
from hurtle.brokers.memory import MemoryBroker


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://")


def _ready(app: Hurtle, queue: str = "default") -> list[Message]:
    consumer = app.broker.consumer([queue])
    got = consumer.fetch(10_000, 0)
    consumer.release(got)
    return [Message.decode(d.raw) for d in got]


def test_send_enqueues_one_message_with_args_and_returns_its_id(app: Hurtle) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    mid = add.send(5, y=6).id
    (m,) = _ready(app)
    assert m.id == mid
    assert (m.task, m.args, m.kwargs) == (add.name, (5,), {"y": 6})
    assert (m.queue, m.attempt, m.priority, m.eta) == ("default", 0, 0, 0.0)


def test_calling_a_task_runs_it_locally_and_enqueues_nothing(app: Hurtle) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add(5, 6) == 11
    assert app.broker.stats(["default"])["default"].ready == 0


def test_send_many_publishes_every_call_in_one_batch_in_order(app: Hurtle) -> None:
    calls: list[int] = []

    class CountingBroker(MemoryBroker):
        def publish(self, messages):  # type: ignore[no-untyped-def]
            calls.append(len(messages))
            super().publish(messages)

    app = Hurtle(CountingBroker())

    @app.task
    def f(*args: object, **kwargs: object) -> None:
        pass

    ids = [h.id for h in f.send_many([(1, 2), [3], {"k": 4}, Args(5, k=6)])]
    assert calls == [4]
    got = _ready(app)
    assert [m.id for m in got] == ids
    assert [(m.args, m.kwargs) for m in got] == [
        ((1, 2), {}),
        ((3,), {}),
        ((), {"k": 4}),
        ((5,), {"k": 6}),
    ]


def test_send_many_rejects_an_item_that_is_not_arguments(app: Hurtle) -> None:
    @app.task
    def f(x: int) -> None:
        pass

    with pytest.raises(TypeError, match="tuple of arguments"):
        f.send_many([5])  # type: ignore[list-item]
    assert app.broker.stats(["default"])["default"].ready == 0


def test_unencodable_argument_raises_encode_error_naming_task_and_type(app: Hurtle) -> None:
    @app.task(name="jobs.store")
    def store(x: object) -> None:
        pass

    class Thing:
        pass

    with pytest.raises(EncodeError, match=r"jobs\.store.*Thing"):
        store.send(Thing())
    with pytest.raises(EncodeError, match="Thing"):
        store.send_many([(1,), (2,), (Thing(),)])
    assert app.broker.stats(["default"])["default"].ready == 0


def test_options_set_queue_priority_and_delay(app: Hurtle) -> None:
    @app.task
    def f(x: int) -> None:
        pass

    before = time.time()
    f.options(queue="slow", priority=9, delay=30).send(1)
    f.options(queue="slow", priority=9).send(2)
    stats = app.broker.stats(["slow"])["slow"]
    assert (stats.ready, stats.delayed) == (1, 1)
    (m,) = _ready(app, "slow")
    assert (m.args, m.priority, m.queue, m.eta) == ((2,), 9, "slow", 0.0)
    consumer = app.broker.consumer(["slow"])
    assert len(consumer.fetch(10, 0)) == 1  # the delayed one is not due for 30 s
    consumer.close()
    delayed = app.broker._queues["slow"].delayed  # type: ignore[attr-defined]
    assert before + 30 <= delayed[0][0] <= time.time() + 30


def test_task_options_default_queue_and_retries(app: Hurtle) -> None:
    @app.task(queue="emails", retries=7, retry_delay=0.5, priority=3)
    def send_email(to: str) -> None:
        pass

    @app.task
    def plain() -> None:
        pass

    assert (send_email.queue, send_email.retries, send_email.retry_delay) == ("emails", 7, 0.5)
    assert plain.queue == "default"
    assert plain.retries == app.settings.default_retries
    assert app.queues() == ["default", "emails"]
    send_email.send("a@b.c")
    (m,) = _ready(app, "emails")
    assert m.priority == 3


def test_priority_outside_0_to_9_is_refused(app: Hurtle) -> None:
    @app.task
    def f() -> None:
        pass

    with pytest.raises(ConfigurationError, match="priority"):
        f.options(priority=10)
    with pytest.raises(ConfigurationError, match="priority"):
        app.task(priority=-1)(lambda: None)


def test_task_name_is_module_and_qualified_name(app: Hurtle) -> None:
    @app.task
    def f() -> None:
        pass

    assert f.name == f"{__name__}.test_task_name_is_module_and_qualified_name.<locals>.f"
    assert app.tasks[f.name] is f


def test_two_apps_in_one_process_do_not_share_tasks_or_brokers() -> None:
    a, b = Hurtle("memory://"), Hurtle("memory://")

    @a.task(name="t")
    def t() -> None:
        pass

    t.send()
    assert "t" not in b.tasks
    assert b.broker.stats(["default"])["default"].ready == 0
    assert a.broker.stats(["default"])["default"].ready == 1


def test_settings_come_from_hurtle_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HURTLE_BROKER_URL", "memory://")
    monkeypatch.setenv("HURTLE_HEARTBEAT_TIMEOUT", "7.5")
    app = Hurtle()
    assert app.settings.broker_url == "memory://"
    assert app.settings.heartbeat_timeout == 7.5
    assert Hurtle(heartbeat_timeout=3).settings.heartbeat_timeout == 3
    monkeypatch.setenv("HURTLE_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="HURTLE_HEARTBEAT_TIMEOUT"):
        Hurtle()


def test_default_broker_is_the_embedded_sqlite_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HURTLE_BROKER_URL", raising=False)
    assert Hurtle().settings.broker_url == "sqlite:///hurtle.db"


def test_bad_broker_url_is_a_configuration_error() -> None:
    app = Hurtle("kafka://nowhere")
    with pytest.raises(ConfigurationError, match="unsupported broker URL 'kafka://nowhere'"):
        app.broker  # noqa: B018
