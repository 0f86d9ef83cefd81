"""An app per broker for the channel conformance suite: memory, sqlite (a temp file), redis,
a Redis Cluster, PostgreSQL (a schema of the test's own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hurtle import Hurtle
from postgres_server import (  # noqa: F401 - fixtures
    postgres_database,
    postgres_server_url,
    postgres_url,
)

BROKERS = ["memory", "sqlite", "redis", "redis-cluster", "postgres"]


@pytest.fixture(params=BROKERS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'channels.db'}"
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def app(url: str) -> Iterator[Hurtle]:
    app = Hurtle(url)
    yield app
    app.close()
