"""``Scenario`` (what one publish-then-consume row runs) and ``Row`` (what it measured).

A scenario is data: the argv of its publisher and of its worker, with ``{python}``, ``{count}``,
``{workdir}`` and ``{redis_url}`` filled in at run time, the environment they need, and what must
be installed for it to run. The driver (``runner``) treats every row alike.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_EXTRA = "pip install -e '.[bench]'"
#: Filled in with the driver's own interpreter.
PY = "{python}"


def publisher(target: str) -> tuple[str, ...]:
    """A row's publisher: ``target`` (``module:function``) timed by ``harness.publish``."""
    return (PY, "-m", "hurtle.bench.harness.publish", target, "{count}")


def hurtle_worker(app: str, *options: str) -> tuple[str, ...]:
    """A row's worker: ``hurtle worker APP OPTIONS`` logging warnings only."""
    return (PY, "-m", "hurtle", "--log-level", "WARNING", "worker", app, *options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scenario:
    #: Row name, as ``--only`` takes it: ``hurtle-redis-solo``, ``celery-prefork``, ...
    name: str
    #: The system measured, for the table: ``hurtle``, ``raw redis-py``, ``Celery``, ...
    system: str
    #: ``acknowledged``, ``ack on receipt`` or ``not acknowledged``.
    guarantee: str
    #: Pool, concurrency, prefetch, batch size: how the row was configured.
    config: str
    publisher: tuple[str, ...]
    worker: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: ``redis``, ``sqlite``, ``nats`` (the NATS server of ``--broker-url``) or ``cluster`` (the
    #: Redis Cluster of ``--broker-url``): the store the row's broker URL points at.
    store: str = "redis"
    #: Appended to the row's broker URL: ``?wait_replicas=1``, ...
    url_query: str = ""
    #: Python modules and programs the row needs; when one is missing the row is skipped.
    modules: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    install: str = BENCH_EXTRA
    #: Distribution (or program) whose version the table shows.
    version_of: str | None = None
    #: Most tasks this row runs, for a peer too slow to run the full count in reasonable time.
    max_count: int | None = None
    #: Writes files the row needs into its work directory; returns extra environment.
    prepare: Callable[[Path, str], dict[str, str]] | None = None
    #: Tasks still queued or held after the run (``None``: the row cannot tell).
    leftover: Callable[[str], int | None] | None = None

    def version(self) -> str:
        """The measured system's version, or ``""`` when unknown."""
        if not self.version_of:
            return ""
        try:
            return metadata.version(self.version_of)
        except metadata.PackageNotFoundError:
            return ""

    def missing(self) -> str | None:
        """Why this row cannot run here, with how to fix it; ``None`` if it can."""
        for module in self.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            if not found:
                return f"{module} is not importable: {self.install}"
        for program in self.programs:
            if shutil.which(program) is None:
                return f"{program} is not on PATH: {self.install}"
        return None


@dataclasses.dataclass(kw_only=True)
class Row:
    name: str
    system: str
    version: str = ""
    guarantee: str = ""
    config: str = ""
    count: int = 0
    skipped: str | None = None
    published: int = 0
    publish_s: float | None = None
    consumed: int = 0
    consume_s: float | None = None
    worker_processes: int = 0
    rss_start_mb: float | None = None
    rss_peak_mb: float | None = None
    rss_end_mb: float | None = None
    leftover: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    rss_series: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    @property
    def publish_rate(self) -> float | None:
        return self.published / self.publish_s if self.publish_s else None

    @property
    def consume_rate(self) -> float | None:
        # the clock starts when the first task finishes, so it spans consumed - 1 tasks
        if not self.consume_s or self.consumed < 2:
            return None
        return (self.consumed - 1) / self.consume_s

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["publish_rate"] = self.publish_rate
        data["consume_rate"] = self.consume_rate
        return data
