"""Middleware and time-limit cost on the memory broker, solo pool: N trivial tasks per case,
cases run in turn for R rounds, medians and ratios to the bare case.

    PYTHONPATH=src python benchmarks/middleware_memory.py [ROUNDS] [N]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from hurtle import Hurtle
from hurtle.middleware import Middleware


class PerCall(Middleware):
    def before_process(self, job: Any) -> None:
        pass


class PerBatch(Middleware):
    def after_batch(self, jobs: Any) -> None:
        pass


class Elsewhere(Middleware):
    def applies_to(self, task: Any) -> bool:
        return False

    def before_process(self, job: Any) -> None:
        pass


def run(n: int, middleware: list[Middleware], limit: float | None) -> float:
    app = Hurtle("memory://", middleware=middleware)

    @app.task(name="t.add", time_limit=limit)
    def add(x: int, y: int) -> int:
        return x + y

    for _ in range(0, n, 10_000):
        add.send_many([(5, 6)] * 10_000)
    worker = app.worker(burst=True)
    started = time.perf_counter()
    worker.run()
    return n / (time.perf_counter() - started)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    cases: list[tuple[str, list[Middleware], float | None]] = [
        ("bare", [], None),
        ("per-call no-op", [PerCall()], None),
        ("after_batch no-op", [PerBatch()], None),
        ("applies to no task", [Elsewhere()], None),
        ("time_limit=10", [], 10.0),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for _ in range(rounds):
        for name, middleware, limit in cases:
            rates[name].append(run(n, middleware, limit))
    bare = statistics.median(rates["bare"])
    for name, _, _ in cases:
        rate = statistics.median(rates[name])
        print(f"{name:<20} {rate:>10,.0f}/s  {rate / bare:.2f}x of bare")


if __name__ == "__main__":
    main()
