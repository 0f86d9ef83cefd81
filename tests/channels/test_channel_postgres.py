"""What only PostgreSQL channels do: frames too large for a notification travel through a table,
and a feed whose connection is cut listens again and counts what it missed."""

from __future__ import annotations

import threading
import time

import psycopg

from hurtle import Hurtle
from hurtle.brokers.postgres.connection import parse_url
from hurtle.channels import ChannelMessage


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


def _feeds_waiting_on_the_counts(url: str) -> int:
    """Feeds that listen again and wait on a lock to read the channels' counts."""
    with psycopg.connect(parse_url(url)[0], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
            "wait_event_type = 'Lock' AND query LIKE 'SELECT channel, epoch, total FROM%%'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_frame_committed_while_a_feed_listens_again_is_received_or_counted_lost_not_both(
    postgres_url: str,
) -> None:
    """A feed that listens again reads the counts after its ``LISTEN``: a frame committed in
    between is in the counts it marks (what was missed) and is delivered to the new connection
    too. It must be one or the other, never received and counted lost."""
    listener, publisher = Hurtle(postgres_url), Hurtle(postgres_url)
    conninfo, schema = parse_url(postgres_url)
    try:
        ch = publisher.channel("window", buffer=0)
        with listener.subscribe("window") as sub:
            ch.publish(0)
            first = sub.get(10)
            assert first is not None and first.data == 0
            got: list[ChannelMessage | None] = [first]
            backend = ch._hub.backend
            with psycopg.connect(conninfo, autocommit=True) as holder:
                with holder.transaction():
                    # the counts cannot be read until this transaction ends
                    holder.execute(f'LOCK TABLE "{schema}".channel_counts IN ACCESS EXCLUSIVE MODE')
                    assert _terminate_listeners(postgres_url) >= 1
                    reader = threading.Thread(target=lambda: got.append(sub.get(20)))
                    reader.start()
                    deadline = time.monotonic() + 20
                    while not _feeds_waiting_on_the_counts(postgres_url):
                        assert time.monotonic() < deadline, "the feed never listened again"
                        time.sleep(0.05)
                    own, backend._conn = backend._conn, holder  # type: ignore[attr-defined]
                    # committed as the lock ends: after the feed's LISTEN, before its read
                    ch.publish(1)
                backend._conn = own  # type: ignore[attr-defined]
                ch.publish(2)
                reader.join(30)
            deadline = time.monotonic() + 20
            while not any(m is not None and m.data == 2 for m in got):  # published last
                assert time.monotonic() < deadline, (got, sub.lost)
                got.append(sub.get(0.2))
            values = [m.data for m in got if m is not None]
            assert (sub.received, sub.lost) in ((3, 0), (2, 1)), (values, sub.lost)
            assert values == sorted(set(values))  # nothing twice, nothing out of order
    finally:
        publisher.close()
        listener.close()
