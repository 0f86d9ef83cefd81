"""Every road by which a worker makes a message a dead letter, for the conformance tests of what
ends with it: its result record (``test_results_contract``), its workflow
(``test_workflows_contract``), its unique lock (``test_limits_contract``).

Each road is a message made to go that way: its task fails for good (``failed``), rejects it
(``rejected``), cannot take its arguments (``unfit``); its expiry passed before it started
(``expired``); it was cancelled (``cancelled``); its task is unknown to the worker (``unknown``);
its bytes are no valid message (``undecodable``: a priority of 99). A test sends one message
per road, runs one ``--burst`` worker in this process over them all, and checks every road.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from hurtle import Hurtle, Reject
from hurtle.ids import new_id
from hurtle.message import Message

ROADS = ("failed", "rejected", "unfit", "expired", "cancelled", "unknown", "undecodable")
#: ``TaskFailed.type`` of the record each road leaves.
TYPES = {
    "failed": "ValueError",
    "rejected": "Reject",
    "unfit": "TypeError",
    "expired": "Expired",
    "cancelled": "Cancelled",
    "unknown": "DeadLetter",
    "undecodable": "DecodeError",
}
#: ``Handle.state`` after each road.
STATES = {road: road if road in ("expired", "cancelled") else "dead" for road in ROADS}
QUEUE = "default"


def dead_app(broker_url: str, **options: Any) -> Hurtle:
    """An app whose tasks ``dead.ok``, ``dead.boom`` (fails) and ``dead.reject`` (rejects)
    take ``options`` (``store_result``, ``unique_for``...); ``dead.total`` is a callback."""
    app = Hurtle(broker_url, heartbeat_timeout=5.0)

    @app.task(name="dead.ok", **options)
    def ok(x: int) -> int:
        return x

    @app.task(name="dead.boom", retries=0, **options)
    def boom(x: int) -> int:
        raise ValueError(f"boom {x}")

    @app.task(name="dead.reject", **options)
    def reject(x: int) -> int:
        raise Reject(f"no {x}")

    @app.task(name="dead.total")
    def total(xs: list[int]) -> int:
        return sum(xs)

    return app


def message(**fields: Any) -> Message:
    return Message(**{"id": new_id(), "task": "dead.ok", "queue": QUEUE, "args": (1,), **fields})


def on_road(road: str, m: Message) -> Message:
    """``m`` as ``road`` makes it (its task, arguments or expiry)."""
    change: dict[str, Any] = {
        "failed": {"task": "dead.boom"},
        "rejected": {"task": "dead.reject"},
        "unfit": {"args": (1, 2, 3)},
        "expired": {"expires": time.time()},  # past once a worker looks at it
        "unknown": {"task": "dead.nobody"},
    }.get(road, {})
    return msgspec.structs.replace(m, **change)


def undecodable(m: Message) -> bytes:
    """The bytes of ``m`` with a priority of 99: refused by ``Message.decode``."""
    fields = list(msgspec.structs.astuple(m))
    fields[Message.__struct_fields__.index("priority")] = 99
    return msgspec.msgpack.encode(fields)


def send(app: Hurtle, roads: dict[str, Message], unique_for: float | None = None) -> None:
    """Publish each road's message as that road needs (``unique_for``: with its lock)."""
    broker = app.broker
    if "undecodable" in roads and unique_for is not None:
        # its lock taken by its valid twin, dropped at once (a purge keeps locks): what holds
        # the lock is then the bytes alone
        assert broker.publish_unique([roads["undecodable"]], unique_for) == [
            roads["undecodable"].id
        ]
        assert broker.purge(QUEUE) == 1
    for road, m in roads.items():
        if road == "undecodable":
            broker.publish_raw(QUEUE, [undecodable(m)])
        elif unique_for is not None:
            assert broker.publish_unique([m], unique_for) == [m.id]
        else:
            broker.publish([m])
    if "cancelled" in roads:
        app.cancel(roads["cancelled"].id)


def drain(app: Hurtle) -> None:
    """Run a burst worker until the queue is empty."""
    app.worker(burst=True, queues=[QUEUE]).run()
