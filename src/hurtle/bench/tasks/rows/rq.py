"""Rows ``rq`` and ``rq-simple``: RQ (``peers.rq_app``) with its default worker class (a fork per
job, so the row is capped) and with ``rq.SimpleWorker``; not acknowledged."""

from __future__ import annotations

import dataclasses

from ...harness.scenario import Scenario
from ..common import peer_row
from ..leftover import llen

#: RQ's default worker forks per job (~30 jobs/s on 2 cores): 100,000 would take an hour.
RQ_FORK_MAX = 2000


def _rq(name: str, config: str, *options: str) -> Scenario:
    return peer_row(
        "rq",
        name,
        "RQ",
        "not acknowledged",
        config,
        worker=("rq.cli", "worker", "--url", "{redis_url}", "--quiet", *options, "bench"),
        leftover=llen("rq:queue:bench"),
    )


ROWS = [
    dataclasses.replace(
        _rq("rq", "rq worker, default Worker class (a fork per job), 1 process"),
        # each job runs in a forked child whose memory dies with it: the probe appends
        env={"HURTLE_BENCH_PROBE_APPEND": "1"},
        max_count=RQ_FORK_MAX,
    ),
    _rq(
        "rq-simple",
        "rq worker -w rq.SimpleWorker (no fork per job), 1 process",
        "--worker-class",
        "rq.SimpleWorker",
    ),
]
