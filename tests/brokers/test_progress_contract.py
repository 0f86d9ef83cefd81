"""Conformance of progress reports on every broker: ``put_progress`` stores the latest report
of each message id for its ttl, seen by every client; ``get_progress`` reads several in one
call; reports live apart from result records."""

from __future__ import annotations

import time
from collections.abc import Callable

from hurtle.brokers import Broker, StoredResult
from hurtle.ids import new_id
from hurtle.message import Message
from hurtle.progress import Progress, decode_progress, encode_progress

MakeBroker = Callable[..., Broker]


def report(id_: str, fraction: float, text: str = "", ttl: float = 60.0) -> StoredResult:
    return StoredResult(id_, encode_progress(Progress(fraction, text, time.time())), ttl)


def test_the_latest_report_of_each_id_is_read_by_every_client(make: MakeBroker) -> None:
    a, b = make(), make()
    x, y, none = new_id(), new_id(), new_id()
    assert b.get_progress([x, y]) == [None, None]
    a.put_progress([report(x, 0.1, "one"), report(y, 0.5, "half")])
    a.put_progress([report(x, 0.4, "resized 4 of 10")])
    found = [decode_progress(p) for p in b.get_progress([x, none, y])]
    assert [(p.fraction, p.message) if p else None for p in found] == [
        (0.4, "resized 4 of 10"),
        None,
        (0.5, "half"),
    ]
    assert b.get_progress([]) == []
    a.put_progress([])  # nothing to store: no error


def test_a_report_is_gone_once_its_ttl_passed(broker: Broker) -> None:
    short, kept = new_id(), new_id()
    broker.put_progress([report(short, 0.2, ttl=0.2), report(kept, 0.3, ttl=60)])
    time.sleep(0.5)
    found = broker.get_progress([short, kept])
    assert found[0] is None
    kept_report = decode_progress(found[1])
    assert kept_report is not None and kept_report.fraction == 0.3


def test_reports_and_results_do_not_replace_each_other(broker: Broker) -> None:
    m = Message(id=new_id(), task="tests.noop", queue="q")
    broker.publish([m])
    consumer = broker.consumer(["q"])
    try:
        batch = consumer.fetch(1, 1.0)
        broker.put_progress([report(m.id, 0.9, "almost")])
        consumer.ack(batch, [StoredResult(m.id, b"the result", 60)])
        broker.put_progress([report(m.id, 1.0, "done")])
    finally:
        consumer.close()
    assert broker.get_result(m.id) == b"the result"
    found = decode_progress(broker.get_progress([m.id])[0])
    assert found is not None and (found.fraction, found.message) == (1.0, "done")
