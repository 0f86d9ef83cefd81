"""Workflows on NATS have no transaction: a worker killed between a step's publishes and its
acknowledgement must neither lose the next link or callback nor set them off twice (the copy
delivered again publishes under the same ``Nats-Msg-Id``, which JetStream drops)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hurtle.brokers import ChordStep, FlowStep, make_broker
from hurtle.brokers.nats.consumer import NatsConsumer
from hurtle.ids import new_id
from hurtle.message import Message
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures


def msg(queue: str = "q", task: str = "tests.member") -> Message:
    return Message(id=new_id(), task=task, queue=queue)


def test_a_worker_killed_before_its_acknowledgement_sets_nothing_off_twice(
    nats_url: str,  # noqa: F811 - fixture
) -> None:
    producer = make_broker(nats_url, heartbeat_timeout=0.3)
    dying = make_broker(nats_url, heartbeat_timeout=0.3)
    try:
        chord_id = new_id()
        callback, nxt = msg("cb", "tests.total"), msg("next", "tests.link")
        producer.publish([msg()])
        gone = dying.consumer(["q"])
        assert isinstance(gone, NatsConsumer)
        (d,) = gone.fetch(1, 1.0)

        def step(delivery: Any) -> FlowStep:
            chord = ChordStep(chord_id, 0, 1, b"r0", 60.0, callback)
            return FlowStep(delivery, publish=(nxt,), chord=chord)

        async def killed(*_: object) -> None:
            raise RuntimeError("killed before the acknowledgement")

        gone.store.settle = killed  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="killed"):
            gone.ack_flow([step(d)])
        stats = producer.stats(["cb", "next", "q"])
        assert (stats["cb"].ready, stats["next"].ready, stats["q"].in_flight) == (1, 1, 1)

        deadline = time.monotonic() + 10
        while not producer.recover():  # its heartbeat lapses: the member comes back
            assert time.monotonic() < deadline, "the dead worker was never recovered"
            time.sleep(0.05)
        keeper = producer.consumer(["q"])
        (again,) = keeper.fetch(1, 2.0)
        keeper.ack_flow([step(again)])
        stats = producer.stats(["cb", "next", "q"])
        assert (stats["cb"].ready, stats["next"].ready, stats["q"].in_flight) == (1, 1, 0)
        assert producer.chord_results(chord_id, 1) == [b"r0"]
        keeper.close()
    finally:
        producer.close()
        dying.close()
