"""Every setting hurtle has, its default, and the one function that reads ``HURTLE_*`` variables.

Precedence: keyword arguments given to ``Hurtle(...)`` win over the environment, which wins over
the defaults below.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConfigurationError

DEFAULT_BROKER_URL = "sqlite:///hurtle.db"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Typed, keyword-only configuration. Each field can be set as ``HURTLE_<FIELD>``."""

    #: Where messages live: ``sqlite:///path``, ``memory://`` or ``redis://host:port/db``.
    broker_url: str = DEFAULT_BROKER_URL
    #: Seconds without a heartbeat after which a worker counts as dead and its tasks are handed
    #: to other workers.
    heartbeat_timeout: float = 20.0
    #: Deaths of its worker a message survives: a message whose worker died holding it more
    #: often (a task that kills its process) becomes a dead letter.
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

    @property
    def effective_heartbeat_interval(self) -> float:
        return self.heartbeat_interval or max(self.heartbeat_timeout / 4.0, 0.05)


def _convert(name: str, kind: Any, raw: str) -> Any:
    try:
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
        if kind in (bool, "bool"):
            return raw.strip().lower() in {"1", "true", "yes", "on"}
    except ValueError:
        raise ConfigurationError(
            f"HURTLE_{name.upper()}={raw!r} is not a valid {kind}: set it to a number"
        ) from None
    return raw


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build ``Settings`` from defaults, then ``HURTLE_*`` variables, then ``overrides``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for name, field in fields.items():
        raw = env.get(f"HURTLE_{name.upper()}")
        if raw is not None and raw != "":
            values[name] = _convert(name, field.type, raw)
    for name, value in (overrides or {}).items():
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigurationError(f"unknown setting {name!r}; known settings are: {known}")
        if value is not None:
            values[name] = value
    settings = Settings(**values)
    if settings.heartbeat_timeout <= 0:
        raise ConfigurationError(
            f"heartbeat_timeout must be positive, got {settings.heartbeat_timeout}"
        )
    return settings
