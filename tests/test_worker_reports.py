"""What a worker counts for its heartbeat reports: per queue and task, whatever the pool."""

from __future__ import annotations

from collections import deque

import pytest

from hurtle import Hurtle
from hurtle.brokers import Delivery
from hurtle.worker.processor import Processor


class _Acker:
    def __init__(self) -> None:
        self.acked = 0
        self.dead = 0

    def ack(self, delivery: Delivery) -> None:
        self.acked += 1

    def ack_many(self, deliveries: list[Delivery]) -> None:
        self.acked += len(deliveries)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.dead += 1


class _State:
    def __init__(self) -> None:
        self.pending: deque[Delivery] = deque()
        self.current: Delivery | None = None
        self.stopping = False
        self.unstarted: list[Delivery] = []
        self.time_limit: float | None = None
        self.overran: list[Delivery] = []


def test_a_mixed_batch_is_counted_per_queue_and_task() -> None:
    app = Hurtle("memory://")

    @app.task(name="add", retries=0)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="boom", retries=0)
    def boom() -> None:
        raise ValueError("no")

    def delivery(queue: str, task: str, args: tuple[int, ...] = ()) -> Delivery:
        return Delivery(queue, app.tasks[task].message(args, {}).encode(), 0)

    batch = [
        delivery("a", "add", (1, 2)),
        delivery("a", "add", (1, 2)),
        delivery("b", "add", (1, 2)),
        delivery("a", "boom"),
        delivery("a", "add", (1, 2)),
        Delivery("a", b"\xffnot a message", 0),
    ]
    acker = _Acker()
    processor = Processor(app, acker)  # type: ignore[arg-type]
    processor.process_many(batch, _State())

    assert processor.tally.snapshot() == {
        ("a", "add"): (3, 0, 0, 0),
        ("b", "add"): (1, 0, 0, 0),
        ("a", "boom"): (1, 1, 0, 1),
        ("a", "(undecodable)"): (1, 1, 0, 1),
    }
    assert (acker.acked, acker.dead) == (4, 2)


@pytest.mark.parametrize("n", [0, 1])
def test_an_empty_or_single_batch_counts_what_ran(n: int) -> None:
    app = Hurtle("memory://")
    app.task(name="t", retries=0)(lambda: None)
    batch = [Delivery("q", app.tasks["t"].message((), {}).encode(), 0) for _ in range(n)]
    processor = Processor(app, _Acker())  # type: ignore[arg-type]
    processor.process_many(batch, _State())
    assert processor.tally.snapshot() == ({("q", "t"): (1, 0, 0, 0)} if n else {})
