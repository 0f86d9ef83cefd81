"""The NATS broker's connection: what a caller sees, and what is logged, when the server is not
there (at the start, or gone for a while), with a private ``nats-server`` each test stops."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import free_port
from hurtle.brokers import make_broker
from hurtle.errors import BrokerError
from hurtle.message import Message
from hurtle.worker.refusals import unreachable
from nats_server import NatsServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    s = NatsServer(tmp_path)
    s.start()
    yield s
    s.stop()


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]


def test_a_broker_for_a_port_nobody_listens_at_fails_at_once_in_one_broker_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError) as info:
        make_broker(url)
    text = str(info.value)
    assert text.startswith(f"cannot connect to NATS at {url}: ")
    assert "Connect call failed" in text and "nats-server" in text
    assert _tracebacks(caplog) == []


def test_a_server_gone_for_a_while_is_a_broker_error_then_reconnected_without_tracebacks(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = make_broker(server.url)
    try:
        m = Message(id="m1", task="t", queue="q", args=())
        broker.publish([m])
        server.stop()
        with pytest.raises(BrokerError) as info:
            broker.stats(["q"])
        assert "NATS" in str(info.value)
        assert unreachable(info.value)  # a worker keeps its outcomes for later
        server.start()  # the same port and store
        deadline = time.monotonic() + 30
        while True:
            try:
                assert broker.stats(["q"])["q"].ready == 1
                break
            except BrokerError:
                assert time.monotonic() < deadline, "never reconnected"
                time.sleep(0.1)
        lost = [r for r in caplog.records if "lost the connection" in r.getMessage()]
        assert lost and lost[0].levelno == logging.WARNING
        assert _tracebacks(caplog) == []
    finally:
        broker.close()
