"""``/metrics``: the cluster's figures in Prometheus' text format, read from the broker.

A custom collector reads the broker on each scrape (no state in the dashboard process):

* ``hurtle_tasks_processed_total``, ``hurtle_tasks_failed_total``, ``hurtle_tasks_retried_total``,
  ``hurtle_tasks_dead_lettered_total`` — counters labelled ``queue`` and ``task``, the cluster's
  totals as workers report them with their heartbeats (``brokers/reports.py``);
* ``hurtle_queue_messages`` — a gauge labelled ``queue`` and ``state`` (ready, delayed,
  in_flight, dead);
* ``hurtle_workers_alive`` — workers whose heartbeat deadline has not passed.

Task run-time histograms are not there: workers do not time tasks one by one (that would put a
clock read per task on the hot path), and a per-batch sum cannot be split per task honestly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..brokers import Broker
from ..brokers.reports import KINDS
from . import queries

_HELP = {
    "processed": "Messages workers took in hand, whatever the outcome.",
    "failed": "Messages whose task raised, or that could not run.",
    "retried": "Failed messages scheduled for another attempt.",
    "dead_lettered": "Messages moved to the dead letters.",
}


class BrokerCollector:
    def __init__(self, broker: Broker, declared: Iterable[str] = ()) -> None:
        self.broker = broker
        self.declared = list(declared)

    def collect(self) -> Iterator[Metric]:
        families = {
            kind: CounterMetricFamily(f"hurtle_tasks_{kind}", _HELP[kind], labels=["queue", "task"])
            for kind in KINDS
        }
        for c in self.broker.totals():
            for kind in KINDS:
                families[kind].add_metric([c.queue, c.task], getattr(c, kind))
        yield from families.values()
        depth = GaugeMetricFamily(
            "hurtle_queue_messages", "Messages per queue and state.", labels=["queue", "state"]
        )
        for name, s in queries.queue_stats(self.broker, self.declared).items():
            for state in ("ready", "delayed", "in_flight", "dead"):
                depth.add_metric([name, state], getattr(s, state))
        yield depth
        yield GaugeMetricFamily(
            "hurtle_workers_alive",
            "Workers whose heartbeat deadline has not passed.",
            value=len(self.broker.workers()),
        )


def registry(broker: Broker, declared: Iterable[str] = ()) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(broker, declared))
    return reg


def render(reg: Any) -> tuple[bytes, str]:
    return generate_latest(reg), CONTENT_TYPE_LATEST
