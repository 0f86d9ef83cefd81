"""What a row left behind after its run: tasks still queued or held, read from the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis


def _client(url: str) -> redis.Redis:
    import redis

    return redis.Redis.from_url(url)


def hurtle(url: str) -> int | None:
    """Ready, delayed and in-flight messages on every hurtle queue (acknowledged ones are gone)."""
    from ...brokers import make_broker

    broker = make_broker(url)
    try:
        stats = broker.stats()
    finally:
        broker.close()
    return sum(q.ready + q.delayed + q.in_flight for q in stats.values())


def llen(*keys: str) -> Callable[[str], int | None]:
    """Total length of some Redis lists."""

    def count(url: str) -> int | None:
        client = _client(url)
        try:
            return sum(int(client.llen(key)) for key in keys)
        finally:
            client.close()

    return count


def celery(url: str) -> int | None:
    """Messages in Celery's ``celery`` list plus those delivered but not yet acknowledged."""
    client = _client(url)
    try:
        return int(client.llen("celery")) + int(client.hlen("unacked"))
    finally:
        client.close()


def postgres_count(query: str) -> Callable[[str], int | None]:
    """The count ``query`` reads from the database of the row's broker URL."""

    def count(url: str) -> int | None:
        import psycopg

        from ...brokers.postgres.connection import parse_url

        with psycopg.connect(parse_url(url)[0]) as conn:
            row = conn.execute(query).fetchone()
        return None if row is None else int(row[0])

    return count
