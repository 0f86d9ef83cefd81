"""Throughput from workers' successive reports, and dead letters shown for people."""

from __future__ import annotations

import time

from hurtle.brokers import DeadLetter, make_broker
from hurtle.brokers.reports import TaskCounts, WorkerReport
from hurtle.dashboard.queries import Throughput, dead_letter_row
from hurtle.message import Message


def report(at: float, processed: int, failed: int = 0, worker: str = "w") -> WorkerReport:
    return WorkerReport(
        id=worker,
        host="h",
        pid=1,
        pool="solo",
        concurrency=1,
        queues=("q",),
        started_at=0.0,
        at=at,
        counts=(TaskCounts("q", "t", processed=processed, failed=failed),),
    )


def test_a_workers_rate_is_its_change_between_reports_summed_over_workers() -> None:
    t = Throughput(make_broker("memory://"))
    assert t.rates([report(100.0, 0)], now=1000.0) == (0.0, 0.0)  # one report: no rate yet
    assert t.rates([report(102.0, 40, 4)], now=1002.0) == (20.0, 2.0)
    assert t.rates([report(102.0, 40, 4)], now=1003.0) == (20.0, 2.0)  # holds until the next
    both = [report(104.0, 40, 4), report(50.0, 0, worker="v")]
    assert t.rates(both, now=1004.0) == (0.0, 0.0)  # idle now; v has one report
    both = [report(104.0, 40, 4), report(51.0, 10, worker="v")]  # v's clock is far behind
    assert t.rates(both, now=1005.0) == (10.0, 0.0)


def test_a_worker_that_stops_reporting_stops_counting() -> None:
    t = Throughput(make_broker("memory://"), every=1.0)
    t.rates([report(100.0, 0)], now=100.0)
    assert t.rates([report(101.0, 50)], now=101.0) == (50.0, 0.0)
    assert t.rates([report(101.0, 50)], now=103.5) == (50.0, 0.0)  # within 2 spans + a sample
    assert t.rates([report(101.0, 50)], now=104.5) == (0.0, 0.0)  # missed more: stale
    assert t.rates([], now=105.0) == (0.0, 0.0)


def test_a_dead_letter_shows_its_reason_apart_from_its_traceback() -> None:
    raw = Message(id="m1", task="add", queue="q", args=(1, b"x"), attempt=2).encode()
    row = dead_letter_row(
        DeadLetter(
            id="d1",
            queue="q",
            raw=raw,
            failed_at=time.time(),
            reason="task add failed on attempt 3 of 3; no retries left:\nTraceback...\nValueError",
        )
    )
    assert row["reason"] == "task add failed on attempt 3 of 3; no retries left:"
    assert row["traceback"] == "Traceback...\nValueError"
    assert (row["message_id"], row["task"], row["attempt"]) == ("m1", "add", 3)
    assert row["args"] == [1, "eA=="]  # JSON-safe: bytes as msgspec's base64
    assert (row["arguments"], row["undecodable"]) == ('[1, "eA=="]', None)  # JSON text

    garbage = dead_letter_row(
        DeadLetter(id="d2", queue="q", raw=b"\xff", reason="bad", failed_at=0.0)
    )
    assert (garbage["task"], garbage["message_id"], garbage["size"]) == (None, None, 1)
    assert garbage["arguments"] is None
    assert garbage["undecodable"].startswith("not a valid hurtle message (1 bytes)")
