"""Celery's task options in ``@app.task(...)``: each is taken with its hurtle meaning, or refused at
registration with one line naming the hurtle option to use.

``autoretry_for`` (hurtle's ``retry_on``) runs on real workers in this process: the listed
exceptions are retried, any other one makes the message a dead letter at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from hurtle import ConfigurationError, Hurtle, Retry, TaskFailed
from hurtle.options import TASK_INSTEAD, TASK_OPTIONS, CeleryTaskOptions, TaskKeywords

T = TypeVar("T")


@pytest.fixture
def app() -> Iterator[Hurtle]:
    app = Hurtle("memory://", store_results=True, default_retry_delay=0.01)
    yield app
    app.close()


def _register(app: Hurtle, **options: Any) -> Any:
    return app.task(name="t", **options)(lambda: None)


def test_max_retries_is_retries_and_bind_false_and_acks_late_true_change_nothing(
    app: Hurtle,
) -> None:
    t = _register(app, max_retries=5, bind=False, acks_late=True)
    assert t.retries == 5
    assert app.task(name="u", max_retries=0)(lambda: None).retries == 0


@pytest.mark.parametrize(
    ("given", "delay"), [(True, 1.0), (5, 5.0), (0.25, 0.25)], ids=["True", "5", "0.25"]
)
def test_retry_backoff_is_the_first_delay_of_the_exponential_backoff(
    app: Hurtle, given: Any, delay: float
) -> None:
    assert _register(app, retry_backoff=given).retry_delay == delay


def test_ignore_result_is_the_opposite_of_store_result(app: Hurtle) -> None:
    assert _register(app, ignore_result=True).store_result is False
    assert app.task(name="u", ignore_result=False)(lambda: None).store_result is True
    plain = Hurtle("memory://")
    assert plain.task(name="v", ignore_result=False)(lambda: None).store_result is True
    assert app.task(name="w", ignore_result=True, store_result=False)(lambda: None).retries == 3


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_retries": None}, r"max_retries=None is not taken: give max_retries=N"),
        ({"max_retries": -1}, r"max_retries=N, an int >= 0"),
        ({"max_retries": 2, "retries": 3}, r"max_retries= is hurtle's retries="),
        ({"retry_backoff": False}, r"always back off"),
        ({"retry_backoff": -1}, r"give True, or the first delay in seconds"),
        ({"retry_backoff": "fast"}, r"give True, or the first delay in seconds"),
        ({"retry_backoff": 2, "retry_delay": 1}, r"retry_backoff= is hurtle's retry_delay="),
        ({"ignore_result": True, "store_result": True}, r"contradicts store_result=True"),
        ({"ignore_result": "yes"}, r"give True or False"),
        ({"acks_late": False}, r"always acknowledges late.*leave acks_late out"),
        ({"bind": True}, r"no bound tasks: drop bind=True.*raise Retry\(delay=N\)"),
        ({"autoretry_for": (ValueError,), "retry_on": (KeyError,)}, r"hurtle's retry_on="),
        ({"autoretry_for": ("ValueError",)}, r"autoretry_for must be exception classes"),
        ({"retry_on": 42}, r"retry_on must be exception classes"),
        ({"soft_time_limit": 10}, r"one time limit: give time_limit=N"),
        ({"default_retry_delay": 180}, r"give retry_delay=N"),
        ({"retry_backoff_max": 600}, r"Hurtle\(max_retry_delay=N\)"),
        ({"retry_jitter": False}, r"always has jitter"),
        ({"track_started": True}, r"no started state"),
        ({"serializer": "json"}, r"MessagePack"),
        ({"base": object}, r"Middleware"),
        ({"colour": "red"}, r"does not take colour=: its options are name, queue, retries"),
    ],
)
def test_a_celery_option_without_a_hurtle_meaning_is_refused_naming_what_to_write(
    app: Hurtle, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match) as info:
        _register(app, **options)
    assert "\n" not in str(info.value) and str(info.value).startswith("task 't': ")
    assert app.tasks == {}


def test_the_options_named_in_refusals_are_the_options_of_app_task() -> None:
    celery = CeleryTaskOptions.__annotations__
    own = [name for name in TaskKeywords.__annotations__ if name not in celery]
    assert sorted(own) == sorted(TASK_OPTIONS)
    assert not set(TASK_INSTEAD) & set(own)


def test_autoretry_for_retries_the_listed_exceptions_and_dead_letters_others_at_once(
    app: Hurtle,
) -> None:
    attempts: dict[str, int] = {"listed": 0, "other": 0, "retry": 0}

    class Flaky(Exception):
        pass

    @app.task(name="listed", max_retries=3, autoretry_for=(Flaky,), retry_backoff=0.01)
    def listed() -> str:
        attempts["listed"] += 1
        if attempts["listed"] < 3:
            raise Flaky("not yet")
        return "third time"

    @app.task(name="other", max_retries=3, autoretry_for=(Flaky, ConnectionError))
    def other() -> None:
        attempts["other"] += 1
        raise KeyError("a bug: retrying cannot help")

    @app.task(name="asks", retries=1, retry_on=Flaky)
    def asks() -> str:
        attempts["retry"] += 1
        if attempts["retry"] == 1:
            raise Retry(delay=0)  # asking for another attempt is always heard
        return "asked"

    ok, bad, asked = listed.delay(), other.delay(), asks.delay()
    worker = app.worker()
    worker.run_in_thread()
    try:
        assert ok.get(timeout=10) == "third time" and attempts["listed"] == 3
        assert asked.get(timeout=10) == "asked"
        with pytest.raises(TaskFailed, match="KeyError"):
            bad.get(timeout=10)
        assert bad.status == "FAILURE" and attempts["other"] == 1
        dead = _eventually(lambda: app.broker.find_dead(bad.id))
        assert "retry_on does not list (Flaky, ConnectionError): not retried" in dead.reason
    finally:
        worker.stop()


def _eventually(read: Callable[[], T | None], timeout: float = 10.0) -> T:
    """What ``read`` returns once it is not None (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while (value := read()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


def test_a_task_without_retry_on_still_retries_every_exception(app: Hurtle) -> None:
    runs: list[int] = []

    @app.task(name="any", retries=2)
    def anything() -> int:
        runs.append(1)
        if len(runs) < 3:
            raise KeyError("again")
        return len(runs)

    assert anything.retry_on is None
    h = anything.delay()
    worker = app.worker()
    worker.run_in_thread()
    try:
        assert h.get(timeout=10) == 3
    finally:
        worker.stop()
