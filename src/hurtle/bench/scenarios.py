"""The rows of ``hurtle bench tasks``, in table order, as data (see ``scenario.Scenario``).

Peers run with their defaults: what a user gets from the getting-started page. Where a peer has
a faster or safer mode that the issue names (Celery's thread/gevent pools, funboost's
acknowledging kind), it gets its own row.
"""

from __future__ import annotations

import os

from ..settings import Settings
from . import funboost_setup, leftover, raw_nats, sidekiq
from .scenario import Scenario

CORES = os.cpu_count() or 1
_S = Settings()
_HURTLE_BATCHES = (
    f"prefetch {_S.fetch_batch_size}, acks in batches of {_S.ack_batch_size} "
    f"or every {_S.ack_interval_ms:g} ms, send_many batches of 1000"
)
_PY = "{python}"
_PUBLISH = (_PY, "-m", "hurtle.bench.publish")
_HURTLE_WORKER = (
    _PY,
    "-m",
    "hurtle",
    "--log-level",
    "WARNING",
    "worker",
    "hurtle.bench.peers.hurtle_app:app",
)
_LOCK = {"HURTLE_BENCH_PROBE_LOCK": "1"}
#: The ``-3q`` rows: three worker processes, each reading one of the three queues of
#: ``hurtle_app.SPREAD`` (one per master of a 3-master cluster).
_THREE_WORKERS = (
    "sh",
    "-c",
    " & ".join(
        f"{_PY} -m hurtle --log-level WARNING worker hurtle.bench.peers.hurtle_app:app "
        f"--pool solo -Q {queue}"
        for queue in ("bench-0", "bench-2", "bench-3")
    )
    + " & wait",
)
_CLUSTER = (
    "a Redis Cluster: hurtle bench tasks --broker-url redis+cluster://host:port (any node; "
    "the cluster is FLUSHED before every row)"
)
#: RQ's default worker forks per job (~30 jobs/s on 2 cores): 100,000 would take an hour.
RQ_FORK_MAX = 2000


def _raw(name: str, publish: str, consume: str, config: str) -> Scenario:
    return Scenario(
        name=name,
        system="raw redis-py",
        guarantee="not acknowledged",
        config=config,
        publisher=(*_PUBLISH, f"hurtle.bench.raw:publish_{publish}", "{count}"),
        worker=(_PY, "-m", "hurtle.bench.raw", "consume", consume, "{count}"),
        modules=("redis",),
        version_of="redis",
        leftover=leftover.raw,
    )


SCENARIOS: list[Scenario] = [
    _raw("raw-single", "single", "single", "one LPUSH per task / one BLPOP per task"),
    _raw("raw-batch", "pipelined", "batch", "pipelined LPUSH, 1000 per round trip / LPOP key 1000"),
    _raw("raw-multi", "multi", "batch", "one LPUSH of 1000 values / LPOP key 1000"),
    Scenario(
        name="hurtle-redis-solo",
        system="hurtle",
        guarantee="acknowledged",
        config=f"solo pool, concurrency 1, {_HURTLE_BATCHES}",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish", "{count}"),
        worker=(*_HURTLE_WORKER, "--pool", "solo"),
        modules=("redis", "hurtle.brokers.redis"),
        version_of="hurtle",
        install="the Redis broker (hurtle/brokers/redis/) and pip install -e '.[redis]'",
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="hurtle-redis-threads",
        system="hurtle",
        guarantee="acknowledged",
        config=f"threads pool, concurrency 10, {_HURTLE_BATCHES}",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish", "{count}"),
        worker=(*_HURTLE_WORKER, "--pool", "threads", "--concurrency", "10"),
        env=_LOCK,
        modules=("redis", "hurtle.brokers.redis"),
        version_of="hurtle",
        install="the Redis broker (hurtle/brokers/redis/) and pip install -e '.[redis]'",
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="hurtle-redis-3q",
        system="hurtle",
        guarantee="acknowledged",
        config=f"3 queues, 3 solo worker processes (one per queue), {_HURTLE_BATCHES}",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish_spread", "{count}"),
        worker=_THREE_WORKERS,
        modules=("redis", "hurtle.brokers.redis"),
        version_of="hurtle",
        install="the Redis broker (hurtle/brokers/redis/) and pip install -e '.[redis]'",
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="hurtle-cluster-solo",
        system="hurtle",
        guarantee="acknowledged",
        config=f"Redis Cluster, solo pool, concurrency 1, {_HURTLE_BATCHES}",
        store="cluster",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish", "{count}"),
        worker=(*_HURTLE_WORKER, "--pool", "solo"),
        modules=("redis", "hurtle.brokers.redis"),
        version_of="hurtle",
        install=_CLUSTER,
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="hurtle-cluster-wait",
        system="hurtle",
        guarantee="acknowledged",
        config=f"Redis Cluster, ?wait_replicas=1, solo pool, concurrency 1, {_HURTLE_BATCHES}",
        store="cluster",
        url_query="?wait_replicas=1",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish", "{count}"),
        worker=(*_HURTLE_WORKER, "--pool", "solo"),
        modules=("redis", "hurtle.brokers.redis"),
        version_of="hurtle",
        install=_CLUSTER,
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="hurtle-cluster-3q",
        system="hurtle",
        guarantee="acknowledged",
        config=f"Redis Cluster, 3 queues on 3 masters, 3 solo worker processes (one per "
        f"queue), {_HURTLE_BATCHES}",
        store="cluster",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish_spread", "{count}"),
        worker=_THREE_WORKERS,
        modules=("redis", "hurtle.brokers.redis"),
        version_of="hurtle",
        install=_CLUSTER,
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="raw-nats",
        system="raw nats-py",
        guarantee="acknowledged",
        config="JetStream work-queue stream, publish acks awaited per 1000 / pull fetch 1000, "
        "msg.ack() each",
        store="nats",
        publisher=(*_PUBLISH, "hurtle.bench.raw_nats:publish", "{count}"),
        worker=(_PY, "-m", "hurtle.bench.raw_nats", "consume", "{count}"),
        modules=("nats",),
        version_of="nats-py",
        install="pip install -e '.[nats]' and --broker-url nats://host:port",
        leftover=raw_nats.leftover,
    ),
    Scenario(
        name="hurtle-nats-solo",
        system="hurtle",
        guarantee="acknowledged",
        config=f"NATS JetStream, solo pool, concurrency 1, {_HURTLE_BATCHES}",
        store="nats",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish", "{count}"),
        worker=(*_HURTLE_WORKER, "--pool", "solo"),
        modules=("nats", "hurtle.brokers.nats"),
        version_of="hurtle",
        install="pip install -e '.[nats]' and --broker-url nats://host:port",
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="hurtle-sqlite-solo",
        system="hurtle",
        guarantee="acknowledged",
        config=f"SQLite file, solo pool, concurrency 1, {_HURTLE_BATCHES}",
        store="sqlite",
        publisher=(*_PUBLISH, "hurtle.bench.peers.hurtle_app:publish", "{count}"),
        worker=(*_HURTLE_WORKER, "--pool", "solo"),
        modules=("hurtle.brokers.sqlite",),
        version_of="hurtle",
        install="the SQLite broker (hurtle/brokers/sqlite/)",
        leftover=leftover.hurtle,
    ),
    Scenario(
        name="celery-prefork",
        system="Celery",
        guarantee="ack on receipt",
        config=f"prefork pool, concurrency {CORES} (default: cores), prefetch multiplier 4",
        publisher=(*_PUBLISH, "hurtle.bench.peers.celery_app:publish", "{count}"),
        worker=(
            _PY,
            "-m",
            "celery",
            "-A",
            "hurtle.bench.peers.celery_app",
            "worker",
            "--loglevel",
            "WARNING",
        ),
        modules=("celery", "redis"),
        version_of="celery",
        leftover=leftover.celery,
    ),
    Scenario(
        name="celery-threads",
        system="Celery",
        guarantee="ack on receipt",
        config=f"threads pool, concurrency {CORES} (default: cores), prefetch multiplier 4",
        publisher=(*_PUBLISH, "hurtle.bench.peers.celery_app:publish", "{count}"),
        worker=(
            _PY,
            "-m",
            "celery",
            "-A",
            "hurtle.bench.peers.celery_app",
            "worker",
            "--loglevel",
            "WARNING",
            "--pool",
            "threads",
        ),
        env=_LOCK,
        modules=("celery", "redis"),
        version_of="celery",
        leftover=leftover.celery,
    ),
    Scenario(
        name="celery-gevent",
        system="Celery",
        guarantee="ack on receipt",
        config="gevent pool, concurrency 100, prefetch multiplier 4",
        publisher=(*_PUBLISH, "hurtle.bench.peers.celery_app:publish", "{count}"),
        worker=(
            _PY,
            "-m",
            "celery",
            "-A",
            "hurtle.bench.peers.celery_app",
            "worker",
            "--loglevel",
            "WARNING",
            "--pool",
            "gevent",
            "--concurrency",
            "100",
        ),
        env=_LOCK,
        modules=("celery", "redis", "gevent"),
        version_of="celery",
        leftover=leftover.celery,
    ),
    Scenario(
        name="rq",
        system="RQ",
        guarantee="not acknowledged",
        config="rq worker, default Worker class (a fork per job), 1 process",
        publisher=(*_PUBLISH, "hurtle.bench.peers.rq_app:publish", "{count}"),
        worker=(_PY, "-m", "rq.cli", "worker", "--url", "{redis_url}", "--quiet", "bench"),
        env={"HURTLE_BENCH_PROBE_APPEND": "1"},
        max_count=RQ_FORK_MAX,
        modules=("rq", "redis"),
        version_of="rq",
        leftover=leftover.llen("rq:queue:bench"),
    ),
    Scenario(
        name="rq-simple",
        system="RQ",
        guarantee="not acknowledged",
        config="rq worker -w rq.SimpleWorker (no fork per job), 1 process",
        publisher=(*_PUBLISH, "hurtle.bench.peers.rq_app:publish", "{count}"),
        worker=(
            _PY,
            "-m",
            "rq.cli",
            "worker",
            "--url",
            "{redis_url}",
            "--quiet",
            "--worker-class",
            "rq.SimpleWorker",
            "bench",
        ),
        modules=("rq", "redis"),
        version_of="rq",
        leftover=leftover.llen("rq:queue:bench"),
    ),
    Scenario(
        name="dramatiq",
        system="Dramatiq",
        guarantee="acknowledged",
        config=f"Redis broker, {CORES} processes x 8 threads (defaults), default middleware",
        publisher=(*_PUBLISH, "hurtle.bench.peers.dramatiq_app:publish", "{count}"),
        worker=(_PY, "-m", "dramatiq", "hurtle.bench.peers.dramatiq_app"),
        env=_LOCK,
        modules=("dramatiq", "redis"),
        version_of="dramatiq",
        leftover=leftover.llen("dramatiq:bench"),
    ),
    Scenario(
        name="huey",
        system="Huey",
        guarantee="not acknowledged",
        config="RedisHuey, huey_consumer with 1 worker thread (default), results stored",
        publisher=(*_PUBLISH, "hurtle.bench.peers.huey_app:publish", "{count}"),
        worker=(_PY, "-m", "huey.bin.huey_consumer", "hurtle.bench.peers.huey_app.huey"),
        env=_LOCK,
        modules=("huey", "redis"),
        version_of="huey",
        leftover=leftover.llen("huey.redis.bench"),
    ),
    *funboost_setup.SCENARIOS,
    *sidekiq.SCENARIOS,
]

BY_NAME = {s.name: s for s in SCENARIOS}
