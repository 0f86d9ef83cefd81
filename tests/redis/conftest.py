"""Fixtures of the Redis tests: a broker on the session's Redis, and a plain client of it to read
the keys the broker writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

import redis
from hurtle.brokers import make_broker
from hurtle.brokers.redis import RedisBroker


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    b = make_broker(redis_url, heartbeat_timeout=20.0)
    assert isinstance(b, RedisBroker)
    yield b
    b.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()
