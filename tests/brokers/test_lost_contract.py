"""Messages whose workers keep dying, on every broker: the broker dead-letters one once its worker
died more than ``max_recoveries`` times while holding it, the last time as the only suspect (the
only message its worker held, or let out of quarantine alone), and ends, in that same step, what
waits on it: its own record, its workflow's, its unique lock (``common.dead_ends``).

A worker "dies" here by fetching and then going silent past its heartbeat timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hurtle.brokers import Broker
from hurtle.flow import FLOW, Flow
from hurtle.ids import new_id
from hurtle.message import Message, message_id
from hurtle.records import DEAD, decode

MakeBroker = Callable[..., Broker]


def kill_until_dead(broker: Broker, target: str, queue: str = "q") -> int:
    """Fetch ``queue`` with workers that die holding what they took, until ``target`` (an id)
    is a dead letter; returns how many of them died holding it."""
    deaths = 0
    for _ in range(60):
        broker.recover()
        if broker.stats([queue])[queue].dead:
            return deaths
        held = broker.consumer([queue]).fetch(10, 0)
        if any(message_id(d.raw) == target for d in held):
            deaths += 1
        if held:
            time.sleep(broker.heartbeat_timeout * 1.5)  # its worker dies holding them
    raise AssertionError(f"{target} is still no dead letter after {deaths} deaths")


@pytest.mark.parametrize("max_recoveries", [1, 2])
def test_a_message_alone_is_a_dead_letter_once_its_worker_died_more_than_max_recoveries(
    make: MakeBroker, max_recoveries: int
) -> None:
    broker = make(heartbeat_timeout=0.2, max_recoveries=max_recoveries)
    poison = Message(id=new_id(), task="tests.poison", queue="q")
    broker.publish([poison])
    deaths = kill_until_dead(broker, poison.id)
    assert deaths == max_recoveries + 1
    [dead] = broker.dead_letters("q")
    assert dead.reason == (
        f"its worker died {deaths} times while holding it (max_recoveries is {max_recoveries})"
    )


def test_a_message_the_broker_dead_letters_ends_its_record_its_workflow_and_its_lock(
    make: MakeBroker,
) -> None:
    broker = make(heartbeat_timeout=0.2, max_recoveries=1)
    flow_id = new_id()
    poison = Message(
        id=new_id(),
        task="tests.poison",
        queue="q",
        headers={FLOW: Flow(id=flow_id, chord=flow_id, total=2)},
        unique="k",
        unique_until=time.time() + 600,
    )
    assert broker.publish_unique([poison], 600) == [poison.id]
    kill_until_dead(broker, poison.id)
    for id_ in (poison.id, flow_id):  # a handle on either raises at once
        payload = broker.get_result(id_)
        assert payload is not None, f"no record under {id_}"
        record = decode(payload)
        assert (record.state, record.value) == (DEAD, ["tests.poison", poison.id])
        assert record.error_type == "WorkerLost"
        assert record.error_message.startswith("its worker died 2 times while holding it")
    again = Message(id=new_id(), task="tests.poison", queue="q", unique="k")
    assert broker.publish_unique([again], 600) == [again.id]  # the lock ended with it
