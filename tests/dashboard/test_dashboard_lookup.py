"""A task lookup by message id is an index read: it finds a dead letter wherever it is, and
pages through no queue's dead letters to do it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from hurtle import Hurtle
from hurtle.brokers import Broker, DeadLetter
from hurtle.brokers.memory import MemoryBroker
from hurtle.dashboard import create_app
from hurtle.ids import new_id
from hurtle.message import Message


def dead_letter(broker: Broker, queue: str, n: int) -> list[str]:
    """Dead-letter ``n`` new messages of ``queue``, in order; their ids."""
    ms = [Message(id=new_id(), task="add", queue=queue) for _ in range(n)]
    broker.publish(ms)
    c = broker.consumer([queue])
    c.dead_letter_many([(d, "failed") for d in c.fetch(n, 1)])
    return [m.id for m in ms]


class NoPaging(MemoryBroker):
    """A broker that fails the test if anything pages through its dead letters."""

    def dead_letters(self, queue: str, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        raise AssertionError(f"a lookup paged through the dead letters of {queue!r}")

    def delete_dead(self, queue: str, ids: Sequence[str]) -> int:  # pragma: no cover
        raise AssertionError("unused")


def test_a_lookup_reads_no_queues_dead_letters() -> None:
    broker = NoPaging()
    app = Hurtle(broker)
    app.task(name="add", queue="q0")(lambda: None)
    ids = [dead_letter(broker, f"q{i}", 3)[1] for i in range(40)]
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        for queue_no in (0, 39):
            row = client.get(f"/api/tasks/{ids[queue_no]}").json()
            assert (row["state"], row["source"], row["queue"]) == (
                "dead",
                "dead_letter",
                f"q{queue_no}",
            )
        assert client.get(f"/api/tasks/{new_id()}").json()["state"] == "unknown"


def test_a_lookup_finds_a_dead_letter_behind_ten_thousand_others_of_its_queue() -> None:
    app = Hurtle(MemoryBroker(dead_letter_max=0))
    app.task(name="add", queue="big")(lambda: None)
    *_, last = dead_letter(app.broker, "big", 10_001)
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        row = client.get(f"/api/tasks/{last}").json()
    assert (row["state"], row["queue"], row["task"]) == ("dead", "big", "add")
