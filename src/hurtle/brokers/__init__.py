"""Brokers: one contract (``base``) and the values it carries (``records``), several stores,
chosen by URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..settings import DEFAULT_DEAD_LETTER_MAX, DEFAULT_DEAD_LETTER_TTL
from .base import Broker, Consumer
from .columns import ResultBatch, StoredResults, UniqueLocks
from .records import ChordStep, DeadLetter, Delivery, FlowStep, Lock, QueueStats, StoredResult
from .ticks import TickClaim

__all__ = [
    "Broker",
    "ChordStep",
    "Consumer",
    "DeadLetter",
    "Delivery",
    "FlowStep",
    "Lock",
    "QueueStats",
    "ResultBatch",
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


def make_broker(
    url: str,
    *,
    heartbeat_timeout: float = 20.0,
    dead_letter_max: int = DEFAULT_DEAD_LETTER_MAX,
    dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL,
    max_recoveries: int = 3,
    create: bool = True,
) -> Broker:
    """The broker a URL names: ``sqlite:///path``, ``memory://``, ``redis://host:port/db``,
    ``redis+cluster://host:port``, ``nats://host:4222`` (``tls://`` for NATS over TLS),
    ``postgresql://user@host/database``.

    ``create=False``: a SQLite file must exist already (the broker never makes one then), and
    so must a PostgreSQL schema; the other brokers have nothing to make and ignore it."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme == "memory":
        from .memory import MemoryBroker

        return MemoryBroker(
            url,
            heartbeat_timeout=heartbeat_timeout,
            dead_letter_max=dead_letter_max,
            dead_letter_ttl=dead_letter_ttl,
            max_recoveries=max_recoveries,
        )
    if scheme == "sqlite":
        from .sqlite import SQLiteBroker

        return SQLiteBroker(
            url,
            heartbeat_timeout=heartbeat_timeout,
            dead_letter_max=dead_letter_max,
            dead_letter_ttl=dead_letter_ttl,
            max_recoveries=max_recoveries,
            create=create,
        )
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        try:
            from .redis import RedisBroker, RedisClusterBroker
        except ImportError as err:
            raise ConfigurationError(
                f"the redis broker needs the redis package ({err}): pip install 'hurtle[redis]'"
            ) from err
        kind = RedisClusterBroker if scheme.endswith("+cluster") else RedisBroker
        return kind(
            url,
            heartbeat_timeout=heartbeat_timeout,
            dead_letter_max=dead_letter_max,
            dead_letter_ttl=dead_letter_ttl,
            max_recoveries=max_recoveries,
        )
    if scheme in ("nats", "tls"):
        try:
            from .nats import NatsBroker
        except ImportError as err:
            raise ConfigurationError(
                f"the NATS broker needs the nats-py package ({err}): pip install 'hurtle[nats]'"
            ) from err
        return NatsBroker(
            url,
            heartbeat_timeout=heartbeat_timeout,
            dead_letter_max=dead_letter_max,
            dead_letter_ttl=dead_letter_ttl,
            max_recoveries=max_recoveries,
        )
    if scheme in ("postgresql", "postgres"):
        try:
            from .postgres import PostgresBroker
        except ImportError as err:
            raise ConfigurationError(
                f"the PostgreSQL broker needs the psycopg and psycopg_pool packages ({err}): "
                "pip install 'hurtle[postgres]'"
            ) from err
        return PostgresBroker(
            url,
            heartbeat_timeout=heartbeat_timeout,
            dead_letter_max=dead_letter_max,
            dead_letter_ttl=dead_letter_ttl,
            max_recoveries=max_recoveries,
            create=create,
        )
    raise ConfigurationError(
        f"unsupported broker URL {url!r}: use sqlite:///path/to/file.db, memory://, "
        "redis://host:port/db, redis+cluster://host:port, nats://host:4222 or "
        "postgresql://user@host/database"
    )
