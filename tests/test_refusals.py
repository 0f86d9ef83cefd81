"""Bad input is refused at the call that takes it, with one ``ConfigurationError`` naming the
option, and nothing is sent: per-call options (also on signatures), headers, result timeouts,
channel options. On the memory broker, with workers in threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from hurtle import ConfigurationError, Hurtle, chain
from hurtle.message import Message


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", store_results=True)


def _sent(app: Hurtle) -> list[Message]:
    consumer = app.broker.consumer(app.broker.queues() or ["default"])
    got = consumer.fetch(10_000, 0)
    consumer.release(got)
    return [Message.decode(d.raw) for d in got]


def test_a_signature_takes_every_option_a_task_takes(app: Hurtle) -> None:
    @app.task(name="add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    before = time.time()
    add.s(1, 2).options(expires=60, queue="q").options(priority=7).send()
    chain(add.s(1).options(expires=30), add.s()).send()
    sent = {m.queue: m for m in _sent(app)}
    assert sent["q"].priority == 7  # the options given first stay
    assert before + 60 <= sent["q"].expires <= time.time() + 60
    assert before + 30 <= sent["default"].expires <= time.time() + 30
    with pytest.raises(ConfigurationError, match="expires must be >= 0"):
        add.s(1).options(expires=-1)


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({1: "x"}, r"headers must have str keys, got the key 1 \(int\)"),
        ([("a",)], r"headers must be a dict of str keys, got list"),
        ([("a", 1)], r"headers must be a dict of str keys, got list"),
        ("ab", r"headers must be a dict of str keys, got str"),
        ({"a": object()}, r"headers cannot be encoded"),
    ],
)
def test_headers_the_worker_could_not_decode_are_refused_when_given(
    app: Hurtle, headers: Any, match: str
) -> None:
    @app.task(name="t")
    def t() -> None: ...

    for give in (
        lambda: t.options(headers=headers),
        lambda: t.s().options(headers=headers),
        lambda: t.apply_async(headers=headers),
    ):
        with pytest.raises(ConfigurationError, match=match):
            give()
    assert _sent(app) == []


def _finishes(fn: Callable[[], object], within: float = 10.0) -> BaseException | None:
    """Run ``fn`` in a thread; what it raised (None if it returned). Fails if it is still
    waiting after ``within`` seconds (the old behaviour: waiting for ever)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
        except BaseException as err:
            outcome.append(err)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    assert outcome, f"still waiting after {within}s"
    return outcome[0]


@pytest.mark.parametrize("timeout", [float("nan"), -1, "5", True, [1]])
def test_a_result_timeout_that_is_no_duration_is_refused_at_once(app: Hurtle, timeout: Any) -> None:
    @app.task(name="t")
    def t() -> None: ...

    handle = t.send()
    raised = _finishes(lambda: handle.result(timeout))
    assert isinstance(raised, ConfigurationError) and "timeout must be" in str(raised)

    async def wait() -> None:
        await asyncio.wait_for(handle.aresult(timeout), 10)

    with pytest.raises(ConfigurationError, match="timeout must be"):
        asyncio.run(wait())


def test_a_result_timeout_of_none_waits_until_the_result_comes(app: Hurtle) -> None:
    @app.task(name="slowish")
    def slowish() -> str:
        return "done"

    handle = slowish.send()
    worker = app.worker()
    thread = worker.run_in_thread()
    try:
        assert handle.result(None) == "done"
        assert asyncio.run(handle.aresult(None)) == "done"
    finally:
        worker.stop()
        thread.join(30)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"flush_interval": float("inf")}, "flush_interval=inf"),
        ({"flush_interval": float("nan")}, "flush_interval=nan"),
        ({"flush_interval": True}, "flush_interval=True"),
        ({"flush_interval": [1]}, r"flush_interval=\[1\]"),
        ({"buffer": [1]}, r"buffer=\[1\]"),
        ({"buffer": -1}, "buffer=-1"),
    ],
)
def test_bad_channel_options_are_refused_naming_the_option(
    app: Hurtle, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        app.channel("prices", **options)
    with pytest.raises(ConfigurationError, match="channel name"):
        app.channel(["prices"])  # type: ignore[arg-type]
