"""Brokers: one contract (``base``) and the values it carries (``records``), several stores,
chosen by URL scheme."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Unpack
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from .base import Broker, BrokerOptions, Consumer
from .columns import ResultBatch, StoredResults, UniqueLocks
from .records import (
    ChordStep,
    DeadLetter,
    Delivery,
    FlowStep,
    Lock,
    QueueStats,
    Ride,
    StoredResult,
)
from .ticks import TickClaim

__all__ = [
    "Broker",
    "BrokerOptions",
    "ChordStep",
    "Consumer",
    "DeadLetter",
    "Delivery",
    "FlowStep",
    "Lock",
    "QueueStats",
    "ResultBatch",
    "Ride",
    "StoredResult",
    "StoredResults",
    "TickClaim",
    "UniqueLocks",
    "make_broker",
]

SCHEMES = (
    "sqlite",
    "memory",
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "nats",
    "tls",
    "postgresql",
    "postgres",
)


@contextmanager
def _needs(broker: str, packages: str, extra: str) -> Iterator[None]:
    """An ImportError inside, of a broker's optional packages, as the one line that says what
    to install."""
    try:
        yield
    except ImportError as err:
        raise ConfigurationError(
            f"the {broker} broker needs {packages} ({err}): pip install 'hurtle[{extra}]'"
        ) from err


def make_broker(url: str, *, create: bool = True, **options: Unpack[BrokerOptions]) -> Broker:
    """The broker a URL names: ``sqlite:///path``, ``memory://``, ``redis://host:port/db``,
    ``redis+cluster://host:port``, ``nats://host:4222`` (``tls://`` for NATS over TLS),
    ``postgresql://user@host/database``; ``options`` are those every broker takes
    (``BrokerOptions``).

    ``create=False``: a SQLite file must exist already (the broker never makes one then), and
    so must a PostgreSQL schema; the other brokers have nothing to make and ignore it."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme == "memory":
        from .memory import MemoryBroker

        return MemoryBroker(url, **options)
    if scheme == "sqlite":
        from .sqlite import SQLiteBroker

        return SQLiteBroker(url, create=create, **options)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        with _needs("redis", "the redis package", "redis"):
            from .redis import RedisBroker, RedisClusterBroker
        kind = RedisClusterBroker if scheme.endswith("+cluster") else RedisBroker
        return kind(url, **options)
    if scheme in ("nats", "tls"):
        with _needs("NATS", "the nats-py package", "nats"):
            from .nats import NatsBroker
        return NatsBroker(url, **options)
    if scheme in ("postgresql", "postgres"):
        with _needs("PostgreSQL", "the psycopg and psycopg_pool packages", "postgres"):
            from .postgres import PostgresBroker
        return PostgresBroker(url, create=create, **options)
    raise ConfigurationError(
        f"unsupported broker URL {url!r}: use sqlite:///path/to/file.db, memory://, "
        "redis://host:port/db, redis+cluster://host:port, nats://host:4222 or "
        "postgresql://user@host/database"
    )
