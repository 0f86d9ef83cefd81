"""``/metrics``: the cluster's figures in Prometheus' text format, read from the broker.

A custom collector reads the broker on each scrape (no state in the dashboard process):

* ``hurtle_tasks_processed_total``, ``hurtle_tasks_failed_total``, ``hurtle_tasks_retried_total``,
  ``hurtle_tasks_dead_lettered_total`` — counters labelled ``queue`` and ``task``, the cluster's
  totals as workers report them with their heartbeats (``brokers/reports.py``); ``task`` is one
  of the app's tasks, or ``(other)`` for the names it does not register (``names.py``);
* ``hurtle_queue_messages`` — a gauge labelled ``queue`` and ``state`` (ready, delayed,
  in_flight, dead), for the known queues less those forgotten when idle (``names.py``);
* ``hurtle_workers_alive`` — workers whose heartbeat deadline has not passed;
* ``hurtle_task_runtime_seconds`` — a histogram labelled ``queue`` and ``task``: the run times of
  the calls of the live workers, summed over them (each worker sends its own with its heartbeats,
  bucketed by ``RUNTIME_BUCKETS``). A worker that stops takes its share with it: the sum drops,
  which ``rate()`` reads as a counter reset.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..brokers import Broker
from ..brokers.reports import KINDS, RUNTIME_BUCKETS
from . import queries
from .names import IdleQueues, fold_counts, fold_histograms

_HELP = {
    "processed": "Messages workers took in hand, whatever the outcome.",
    "failed": "Messages whose task raised, or that could not run.",
    "retried": "Failed messages scheduled for another attempt.",
    "dead_lettered": "Messages moved to the dead letters.",
}


class BrokerCollector:
    def __init__(
        self,
        broker: Broker,
        declared: Iterable[str] = (),
        known: Collection[str] = (),
        idle: IdleQueues | None = None,
    ) -> None:
        self.broker = broker
        self.declared = list(declared)
        self.known = known
        self.idle = idle

    def collect(self) -> Iterator[Metric]:
        families = {
            kind: CounterMetricFamily(f"hurtle_tasks_{kind}", _HELP[kind], labels=["queue", "task"])
            for kind in KINDS
        }
        for c in fold_counts(self.broker.totals(), self.known):
            for kind in KINDS:
                families[kind].add_metric([c.queue, c.task], getattr(c, kind))
        yield from families.values()
        depth = GaugeMetricFamily(
            "hurtle_queue_messages", "Messages per queue and state.", labels=["queue", "state"]
        )
        for name, s in queries.queue_stats(self.broker, self.declared, self.idle).items():
            for state in ("ready", "delayed", "in_flight", "dead"):
                depth.add_metric([name, state], getattr(s, state))
        yield depth
        workers = self.broker.workers()
        yield GaugeMetricFamily(
            "hurtle_workers_alive",
            "Workers whose heartbeat deadline has not passed.",
            value=len(workers),
        )
        runtime = HistogramMetricFamily(
            "hurtle_task_runtime_seconds",
            "Run time of task calls on live workers, in seconds.",
            labels=["queue", "task"],
        )
        bounds = [f"{b:g}" for b in RUNTIME_BUCKETS] + ["+Inf"]
        for h in fold_histograms(queries.runtime_histograms(workers), self.known):
            cumulative, running = [], 0
            for n in h["counts"]:
                running += n
                cumulative.append(running)
            runtime.add_metric(
                [h["queue"], h["task"]],
                list(zip(bounds, cumulative, strict=True)),
                h["sum"],
            )
        yield runtime


def registry(
    broker: Broker,
    declared: Iterable[str] = (),
    known: Collection[str] = (),
    idle: IdleQueues | None = None,
) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(broker, declared, known, idle))
    return reg


def render(reg: Any) -> tuple[bytes, str]:
    return generate_latest(reg), CONTENT_TYPE_LATEST
