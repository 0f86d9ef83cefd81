"""What the rows of ``hurtle bench tasks`` declare alike: a hurtle row with the batch settings
every hurtle row reports, a row of another task queue or of a raw client loop of ``peers``, how
to install each broker, the machine's cores, and the environment flag for pools that finish
tasks on several threads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ...settings import Settings
from ..harness.scenario import PY, Scenario, hurtle_worker, publisher
from . import leftover

CORES = os.cpu_count() or 1
#: Tasks finish on several threads of one process: the probe takes a lock.
LOCK = {"HURTLE_BENCH_PROBE_LOCK": "1"}
REDIS_INSTALL = "the Redis broker (hurtle/brokers/redis/) and pip install -e '.[redis]'"
NATS_INSTALL = "pip install -e '.[nats]' and --broker-url nats://host:port"
POSTGRES_INSTALL = "pip install -e '.[postgres]' and --broker-url postgresql://user@host/database"

_S = Settings()
HURTLE_BATCHES = (
    f"prefetch {_S.fetch_batch_size}, acks in batches of {_S.ack_batch_size} "
    f"or every {_S.ack_interval_ms:g} ms, send_many batches of 1000"
)


def hurtle_row(
    name: str,
    config: str,
    *options: str,
    publish: str = "publish",
    worker: tuple[str, ...] | None = None,
    modules: tuple[str, ...] = ("redis", "hurtle.brokers.redis"),
    install: str = REDIS_INSTALL,
    env: Mapping[str, str] | None = None,
    store: str = "redis",
    url_query: str = "",
) -> Scenario:
    """A row of hurtle itself: ``bench.add`` of ``peers.hurtle_app``, published with its
    ``publish`` function, consumed by ``hurtle worker`` with ``options`` (or ``worker``)."""
    return Scenario(
        name=name,
        system="hurtle",
        guarantee="acknowledged",
        config=f"{config}, {HURTLE_BATCHES}",
        publisher=publisher(f"hurtle.bench.peers.hurtle_app:{publish}"),
        worker=worker or hurtle_worker("hurtle.bench.peers.hurtle_app:app", *options),
        modules=modules,
        version_of="hurtle",
        install=install,
        leftover=leftover.hurtle,
        env=env or {},
        store=store,
        url_query=url_query,
    )


def peer_row(
    peer: str,
    name: str,
    system: str,
    guarantee: str,
    config: str,
    *,
    worker: tuple[str, ...],
    modules: tuple[str, ...] = (),
    **more: Any,
) -> Scenario:
    """A row of the Python task queue ``peer`` on Redis, its app in ``peers.<peer>_app``:
    published by that app's ``publish``, consumed by ``python -m`` ``worker``; it needs ``peer``,
    redis and ``modules``, and shows ``peer``'s version. ``more`` are the row's other fields."""
    return Scenario(
        name=name,
        system=system,
        guarantee=guarantee,
        config=config,
        publisher=publisher(f"hurtle.bench.peers.{peer}_app:publish"),
        worker=(PY, "-m", *worker),
        modules=(peer, "redis", *modules),
        version_of=peer,
        **more,
    )


def raw_row(
    peer: ModuleType,
    client: str,
    guarantee: str,
    config: str,
    *,
    store: str,
    module: str,
    install: str,
) -> Scenario:
    """Row ``raw-STORE``: the raw ``client`` loop of ``peer`` (a ``peers`` module with
    ``publish``, ``consume COUNT`` as ``__main__`` and ``leftover``, as ``peers.raw_loop`` has
    them) on the ``store`` of ``--broker-url``; it needs ``module``."""
    return Scenario(
        name=f"raw-{store}",
        system=f"raw {client}",
        guarantee=guarantee,
        config=config,
        store=store,
        publisher=publisher(f"{peer.__name__}:publish"),
        worker=(PY, "-m", peer.__name__, "consume", "{count}"),
        modules=(module,),
        version_of=client,
        install=install,
        leftover=peer.leftover,
    )
