"""Every setting hurtle has, its default, and the one function that reads ``HURTLE_*`` variables.

Precedence: keyword arguments given to ``Hurtle(...)`` win over the environment, which wins over
the defaults below. Every value is checked when it is loaded (``BOUNDS``): a numeric setting must
be a finite number within its bounds, so ``HURTLE_HEARTBEAT_TIMEOUT=nan`` fails at once with a
``ConfigurationError`` naming the variable, not later inside a worker.

``encryption_keys`` are secrets: given as bytes or base64 text (``HURTLE_ENCRYPTION_KEYS``,
comma-separated), kept as bytes, never shown (not in ``repr``, not in an error message).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConfigurationError
from .names import QUEUE_NAME_RULE, queue_name_problem
from .sealing import parse_key

DEFAULT_BROKER_URL = "sqlite:///hurtle.db"
DEFAULT_DEAD_LETTER_MAX = 10_000
DEFAULT_DEAD_LETTER_TTL = 180 * 24 * 3600.0
DEFAULT_RESULT_TTL = 24 * 3600.0
#: The brokers an outbox relays to (``outbox``): those outside the application's database that
#: can skip a message published twice (``Broker.publish_once``).
OUTBOX_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster", "nats", "tls")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Typed, keyword-only configuration. Each field can be set as ``HURTLE_<FIELD>``."""

    #: Where messages live: ``sqlite:///path``, ``memory://`` or ``redis://host:port/db``.
    broker_url: str = DEFAULT_BROKER_URL
    #: A PostgreSQL URL (``postgresql://user@host/db[?schema=hurtle]``): sends with
    #: ``connection=`` write to an outbox table there, in the caller's transaction, and a relay
    #: moves what is committed to the broker (a Redis or NATS one). Empty: no outbox.
    outbox: str = ""
    #: Seconds without a heartbeat after which a worker counts as dead and its tasks are handed
    #: to other workers.
    heartbeat_timeout: float = 20.0
    #: Deaths of its worker a message survives: a message whose worker died holding it more
    #: often (a task that kills its process) becomes a dead letter at the first death past this
    #: at which it was the only suspect (the one message its worker held, or let out alone).
    max_recoveries: int = 3
    #: Seconds between two heartbeats of a worker; ``0`` means a quarter of the timeout.
    heartbeat_interval: float = 0.0
    #: Queue of tasks that name none.
    default_queue: str = "default"
    #: Attempts after the first one for tasks that do not say otherwise.
    default_retries: int = 3
    #: First retry delay in seconds; doubles on each attempt, with jitter.
    default_retry_delay: float = 1.0
    #: Upper bound on any retry delay, in seconds.
    max_retry_delay: float = 3600.0
    #: Outcomes the acker gathers before it flushes them in one round trip.
    ack_batch_size: int = 1000
    #: Milliseconds after which the acker flushes whatever it has.
    ack_interval_ms: float = 5.0
    #: Most messages one fetch may take.
    fetch_batch_size: int = 1000
    #: Seconds a fetch waits on an empty queue before the worker looks around again.
    fetch_timeout: float = 1.0
    #: Seconds that running tasks get to finish on a graceful stop.
    shutdown_timeout: float = 30.0
    #: Seconds a ``--burst`` worker keeps trying a broker it cannot reach before it gives up
    #: (exit 2, queues unfinished). A worker that is not in burst mode never gives up.
    unreachable_timeout: float = 60.0
    #: Most dead letters kept per queue; a new one beyond it drops the oldest, with a warning in
    #: the log. ``0``: no limit.
    dead_letter_max: int = DEFAULT_DEAD_LETTER_MAX
    #: Seconds a dead letter is kept (default 180 days); older ones of a queue are dropped when it
    #: gets its next dead letter. ``0``: until purged.
    dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL
    #: Keep the results of every task (a task's own ``store_result`` wins).
    store_results: bool = False
    #: Seconds a result is kept (default one day), for tasks that do not say otherwise.
    result_ttl: float = DEFAULT_RESULT_TTL
    #: Keys (32 bytes each, or their URL-safe base64 text; comma-separated in the variable) that
    #: seal the arguments and results of encrypted tasks: the first seals, any opens
    #: (``hurtle.sealing``). Never shown.
    encryption_keys: tuple[bytes, ...] = dataclasses.field(default=(), repr=False)
    #: Seal the arguments and results of every task (a task's own ``encrypt`` wins); needs
    #: ``encryption_keys``.
    encrypt: bool = False

    @property
    def effective_heartbeat_interval(self) -> float:
        return self.heartbeat_interval or max(self.heartbeat_timeout / 4.0, 0.05)


#: The lowest value of each numeric setting, and whether that value itself is allowed. Every
#: numeric setting must also be finite (no NaN, no infinity).
BOUNDS: dict[str, tuple[float, bool]] = {
    "heartbeat_timeout": (0, False),
    "heartbeat_interval": (0, True),
    "default_retries": (0, True),
    "default_retry_delay": (0, True),
    "max_retry_delay": (0, True),
    "ack_batch_size": (1, True),
    "ack_interval_ms": (0, True),
    "fetch_batch_size": (1, True),
    "fetch_timeout": (0, False),
    "shutdown_timeout": (0, True),
    "unreachable_timeout": (0, False),
    "max_recoveries": (1, True),
    "dead_letter_max": (0, True),
    "dead_letter_ttl": (0, True),
    "result_ttl": (0, False),
}


#: Settings whose values are never shown.
SECRET = frozenset({"encryption_keys"})


def _convert(name: str, kind: Any, raw: str) -> Any:
    if name == "encryption_keys":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    try:
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
        if kind in (bool, "bool"):
            return raw.strip().lower() in {"1", "true", "yes", "on"}
    except ValueError:
        what = "a whole number" if kind in (int, "int") else "a number"
        raise ConfigurationError(f"HURTLE_{name.upper()}={raw!r}: {name} must be {what}") from None
    return raw


def _keys(value: Any, source: str) -> tuple[bytes, ...]:
    """The keys of ``encryption_keys`` as bytes, checked (errors name the key's place, never
    its value)."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, list | tuple):
        raise ConfigurationError(
            f"{source}: encryption_keys must be a list of keys (the first seals, any opens), "
            f"got {type(value).__name__}"
        )
    if not value:
        raise ConfigurationError(f"{source}: encryption_keys is empty: give at least one key")
    return tuple(
        parse_key(k, f"{source}: key {i + 1} of encryption_keys") for i, k in enumerate(value)
    )


def _problem(name: str, kind: Any, value: Any) -> str | None:
    """What is wrong with ``value`` for the setting ``name`` of type ``kind``, or None."""
    if name == "outbox":
        if not isinstance(value, str) or value.partition("://")[0].lower() not in (
            "postgresql",
            "postgres",
        ):
            shown = value.split("@")[-1] if isinstance(value, str) else value
            return (
                f"must be a PostgreSQL URL (postgresql://user@host/database, the database your "
                f"application writes to), got {shown!r}"
            )
        return None
    if name == "default_queue":
        problem = queue_name_problem(value)
        return None if problem is None else f"is not a queue name: {problem}; {QUEUE_NAME_RULE}"
    if kind in (str, "str"):
        if not isinstance(value, str) or not value:
            return f"must be a non-empty string, got {value!r}"
        return None
    if kind in (bool, "bool"):
        return None if isinstance(value, bool) else f"must be True or False, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {value!r} ({type(value).__name__})"
    if kind in (int, "int") and not isinstance(value, int):
        return f"must be a whole number, got {value!r}"
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        return f"must be a finite number, got {value!r}"
    low, inclusive = BOUNDS.get(name, (-math.inf, True))
    if value < low or (value == low and not inclusive):
        return f"must be {'>=' if inclusive else '>'} {low:g}, got {value!r}"
    return None


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build ``Settings`` from defaults, then ``HURTLE_*`` variables, then ``overrides``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for name, field in fields.items():
        raw = env.get(f"HURTLE_{name.upper()}")
        if raw is not None and raw != "":
            values[name] = _convert(name, field.type, raw)
            sources[name] = (
                f"HURTLE_{name.upper()}" if name in SECRET else f"HURTLE_{name.upper()}={raw!r}"
            )
    for name, value in (overrides or {}).items():
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigurationError(f"unknown setting {name!r}; known settings are: {known}")
        if value is not None:
            values[name] = value
            sources[name] = f"{name}=..." if name in SECRET else f"{name}={value!r}"
    for name, value in values.items():
        if name in SECRET:
            values[name] = _keys(value, sources[name])
            continue
        problem = _problem(name, fields[name].type, value)
        if problem is not None:
            raise ConfigurationError(f"{sources[name]}: {name} {problem}")
    if values.get("encrypt") and not values.get("encryption_keys"):
        raise ConfigurationError(
            f"{sources['encrypt']}: sealing every task needs encryption_keys; give them "
            "(HURTLE_ENCRYPTION_KEYS, or Hurtle(encryption_keys=[...])), e.g. from "
            "hurtle.new_key()"
        )
    return Settings(**values)


def check_outbox(broker_url: str, outbox: str) -> None:
    """Refuse an outbox beside a broker that cannot relay from it (``OUTBOX_SCHEMES``)."""
    scheme = broker_url.partition("://")[0].lower()
    if not outbox or scheme in OUTBOX_SCHEMES:
        return
    if scheme in ("postgresql", "postgres"):
        why = "the PostgreSQL broker writes connection= sends in your transaction itself"
    else:
        why = f"a {scheme} broker cannot relay one"
    raise ConfigurationError(
        f"outbox= is for a Redis, Redis Cluster or NATS broker, and this app's is "
        f"{broker_url.split('@')[-1]!r}: {why}; drop outbox="
    )


def not_transactional(url: str) -> str:
    """Why a broker at ``url`` cannot write a message in the application's transaction."""
    scheme = url.partition(":")[0] or url
    first = (
        f"connection= writes the message in your database transaction, which the PostgreSQL "
        f"broker (postgresql://...) does itself, and this app's broker is {url!r}"
    )
    if scheme in OUTBOX_SCHEMES:
        return (
            f"{first}: on {scheme} give the app an outbox, a table in your PostgreSQL "
            "database that a relay moves to the broker: "
            "Hurtle(..., outbox='postgresql://user@host/yourdb') (docs/transactions.md, "
            '"The outbox")'
        )
    return (
        f"{first}: on {scheme} send after the commit (Django's transaction.on_commit, or after "
        "session.commit()), or use a Redis or NATS broker with outbox="
    )
