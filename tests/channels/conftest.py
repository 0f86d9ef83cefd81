"""An app per broker for the channel conformance suite: memory, sqlite (a temp file), redis,
a Redis Cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hurtle import Hurtle

BROKERS = ["memory", "sqlite", "redis", "redis-cluster"]


@pytest.fixture(params=BROKERS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'channels.db'}"
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def app(url: str) -> Iterator[Hurtle]:
    app = Hurtle(url)
    yield app
    app.close()
