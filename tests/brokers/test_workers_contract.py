"""Workers' reports: stored with heartbeats, read by ``workers()``, summed for good by ``totals()``.

Runs on every broker (``conftest.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from helpers import StallProof
from hurtle.brokers import Broker, Consumer
from hurtle.brokers.reports import Reporter, Tally, TaskCounts

MakeBroker = Callable[..., Broker]


def _reporting(broker: Broker, worker_id: str) -> tuple[Consumer, Tally]:
    """A consumer of queue ``q`` whose heartbeats report a tally."""
    consumer = broker.consumer(["q"], worker_id)
    tally = Tally()
    consumer.reporter = Reporter(
        tally, worker_id=worker_id, pool="threads", concurrency=4, queues=["q"]
    )
    return consumer, tally


def test_a_heartbeat_stores_the_workers_report(broker: Broker) -> None:
    consumer, tally = _reporting(broker, "w1")
    tally.add_many({("q", "add"): 5})
    tally.add("q", "add", 1)  # one failed
    consumer.heartbeat()

    (report,) = broker.workers()
    assert (report.id, report.pool, report.concurrency, report.queues) == (
        "w1",
        "threads",
        4,
        ("q",),
    )
    assert report.deadline > time.time()
    assert report.counts == (TaskCounts("q", "add", processed=5, failed=1),)
    assert broker.totals() == [TaskCounts("q", "add", processed=5, failed=1)]


def test_totals_add_what_changed_between_beats_once(broker: Broker) -> None:
    consumer, tally = _reporting(broker, "w1")
    tally.add_many({("q", "add"): 2})
    consumer.heartbeat()
    consumer.heartbeat()  # nothing new: adds nothing
    tally.add_many({("q", "add"): 3, ("q", "mul"): 1})
    tally.add("q", "mul", 3)  # dead-lettered
    consumer.heartbeat()
    assert broker.totals() == [
        TaskCounts("q", "add", processed=5),
        TaskCounts("q", "mul", processed=1, dead_lettered=1),
    ]
    (report,) = broker.workers()
    assert report.total("processed") == 6


def test_totals_sum_every_worker(make: MakeBroker) -> None:
    first, second = make(), make()
    for broker, worker_id, n in ((first, "w1", 2), (second, "w2", 3)):
        consumer, tally = _reporting(broker, worker_id)
        tally.add_many({("q", "add"): n})
        consumer.heartbeat()
    assert [r.id for r in first.workers()] == ["w1", "w2"]
    assert first.totals() == [TaskCounts("q", "add", processed=5)]


def test_a_dead_workers_report_goes_but_its_counts_stay_in_the_totals(make: MakeBroker) -> None:
    short = make(heartbeat_timeout=0.2)
    consumer, tally = _reporting(short, "dies")
    tally.add_many({("q", "add"): 7})
    with StallProof(0.2) as clock:
        consumer.heartbeat()
        clock.beat()
        assert [r.id for r in short.workers()] == ["dies"]

    reader = make()
    deadline = time.monotonic() + 10
    while reader.workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reader.workers() == []
    assert reader.totals() == [TaskCounts("q", "add", processed=7)]


def test_a_worker_that_closes_leaves_the_list_with_its_last_counts_in_the_totals(
    make: MakeBroker,
) -> None:
    broker = make()
    stays, _ = _reporting(make(), "stays")
    stays.heartbeat()
    leaves, tally = _reporting(broker, "leaves")
    leaves.heartbeat()  # listed, nothing counted yet
    tally.add_many({("q", "add"): 500})  # ran within one heartbeat interval
    tally.add("q", "add", 3)  # one dead-lettered
    leaves.close()
    assert [r.id for r in broker.workers()] == ["stays"]
    assert _stored_reports(broker) == ["stays"]
    assert broker.totals() == [TaskCounts("q", "add", processed=500, dead_lettered=1)]


def test_a_heartbeat_without_a_reporter_stores_no_report(broker: Broker) -> None:
    broker.consumer(["q"], "plain").heartbeat()
    assert broker.workers() == []
    assert broker.totals() == []


def test_a_beat_forgets_the_reports_of_workers_past_their_deadline(make: MakeBroker) -> None:
    """Without anyone reading ``workers()``, dead workers' reports do not pile up."""
    short = make(heartbeat_timeout=0.2)
    consumer, _ = _reporting(short, "dies")
    consumer.heartbeat()
    time.sleep(0.3)  # past its deadline: nothing to await but the clock
    alive, _ = _reporting(make(), "lives")
    alive.heartbeat()
    assert _stored_reports(short) == ["lives"]


def _stored_reports(broker: Broker) -> list[str]:
    """Ids of the reports the store still holds, whatever their deadline."""
    broker = getattr(broker, "inner", broker)  # a ShardedBroker's store is its inner broker's
    url = broker.url
    if url.startswith("memory"):
        return sorted(broker._reports)  # type: ignore[attr-defined]
    if url.startswith("sqlite"):
        with broker._read() as conn:  # type: ignore[attr-defined]
            return [r[0] for r in conn.execute("SELECT worker_id FROM worker_reports")]
    if url.startswith("nats"):
        return broker._stored_reports()  # type: ignore[attr-defined, no-any-return]
    if url.startswith("postgres"):
        with broker._cursor("test") as cur:  # type: ignore[attr-defined]
            sql = broker._sql.format("SELECT worker_id FROM {s}.worker_reports ORDER BY 1")  # type: ignore[attr-defined]
            return [r[0] for r in cur.execute(sql)]
    client = broker._client  # type: ignore[attr-defined]
    keys = sorted(k.decode() for k in client.keys("hurtle:workers:report:*"))
    members = sorted(m.decode() for m in client.zrange("hurtle:workers:deadlines", 0, -1))
    assert [k.rsplit(":", 1)[1] for k in keys] == members
    return members


def test_a_report_sent_between_beats_is_stored_and_counted_once(make: MakeBroker) -> None:
    broker = make()
    consumer, tally = _reporting(broker, "busy")
    consumer.heartbeat()
    tally.add_many({("q", "add"): 4})
    consumer.send_report()
    consumer.send_report()  # nothing new: adds nothing
    (report,) = broker.workers()
    assert report.total("processed") == 4 and report.deadline > time.time()
    assert broker.totals() == [TaskCounts("q", "add", processed=4)]
    tally.add_many({("q", "add"): 1})
    consumer.heartbeat()  # the beat adds only what came since
    assert broker.totals() == [TaskCounts("q", "add", processed=5)]
