"""What only PostgreSQL channels do: frames too large for a notification travel through a table,
and a feed whose connection is cut listens again and counts what it missed."""

from __future__ import annotations

import time

import psycopg

from hurtle import Hurtle
from hurtle.brokers.postgres.connection import parse_url


def _terminate_listeners(url: str) -> int:
    """Cut the connections of the feeds (their last statement: ``LISTEN``, or the read of the
    counts that follows it)."""
    with psycopg.connect(parse_url(url)[0], autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() AND (query LIKE 'LISTEN%%' "
            "OR query LIKE 'SELECT channel, epoch, total FROM%%')"
        ).fetchall()
    return len(rows)


def test_a_frame_too_large_for_a_notification_arrives_whole(postgres_url: str) -> None:
    app = Hurtle(postgres_url)
    try:
        ch = app.channel("big", buffer=0)
        with ch.subscribe() as sub:
            ch.publish("x" * 50_000)
            ch.publish("small")
            got = [sub.get(10), sub.get(10)]
        assert [m.data for m in got if m is not None] == ["x" * 50_000, "small"]
        assert sub.lost == 0
    finally:
        app.close()


def test_a_feed_cut_off_listens_again_and_counts_what_it_missed(postgres_url: str) -> None:
    app = Hurtle(postgres_url)
    try:
        ch = app.channel("cut", buffer=0)
        with ch.subscribe() as sub:
            ch.publish(0)
            first = sub.get(10)
            assert first is not None and first.data == 0
            assert _terminate_listeners(postgres_url) >= 1
            for i in range(1, 6):
                ch.publish(i)
            deadline = time.monotonic() + 20
            got = [first.data]
            while sub.received + sub.lost < 6:
                assert time.monotonic() < deadline, (sub.received, sub.lost)
                m = sub.get(0.2)
                if m is not None:
                    got.append(m.data)
        assert sub.received + sub.lost == 6
        assert got == sorted(got)  # nothing out of order, nothing twice
    finally:
        app.close()
