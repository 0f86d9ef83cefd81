"""What trimming dead letters leaves in each store: nothing of a dropped dead letter survives.

The conformance suite sees dead letters only through the contract; these look at the storage
behind it (Redis keeps a dead letter in a zset and two hashes; SQLite in one table), where a
leftover would grow without bound although every listing looks right.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hurtle.brokers import Broker, make_broker
from hurtle.brokers.keys import queue_keys
from hurtle.brokers.sqlite import SQLiteBroker
from hurtle.ids import new_id
from hurtle.message import Message


def dead_letter(broker: Broker, n: int, queue: str = "q") -> None:
    broker.publish([Message(id=new_id(), task="t", queue=queue, args=(i,)) for i in range(n)])
    c = broker.consumer([queue])
    for i, d in enumerate(c.fetch(n, 1)):
        c.dead_letter(d, f"reason {i}")
    c.close()


@pytest.fixture
def capped_redis(redis_url: str) -> Iterator[Broker]:
    b = make_broker(redis_url, dead_letter_max=5)
    yield b
    b.close()


def test_redis_drops_the_bytes_and_reason_of_dead_letters_beyond_the_cap(
    capped_redis: Broker, redis_url: str
) -> None:
    redis = pytest.importorskip("redis")
    dead_letter(capped_redis, 8)
    k = queue_keys("q")
    client = redis.Redis.from_url(redis_url)
    kept = {m.decode() for m in client.zrange(k.dead, 0, -1)}
    assert kept == {d.id for d in capped_redis.dead_letters("q")} and len(kept) == 5
    assert {f.decode() for f in client.hkeys(k.dead_raw)} == kept
    assert {f.decode() for f in client.hkeys(k.dead_reason)} == kept
    client.close()


def test_redis_trims_a_backlog_far_above_the_cap_over_several_dead_letters(
    redis_url: str,
) -> None:
    """A cap lowered under a big backlog shrinks it by at most 10,000 per dead letter."""
    big = make_broker(redis_url, dead_letter_max=0)
    dead_letter(big, 10_003)
    big.close()
    capped = make_broker(redis_url, dead_letter_max=1)
    dead_letter(capped, 1)  # 10,004 -> 10,004 - 10,000
    assert capped.stats(["q"])["q"].dead == 4
    dead_letter(capped, 1)
    assert capped.stats(["q"])["q"].dead == 1
    assert [d.reason for d in capped.dead_letters("q")] == ["reason 0"]
    capped.close()


def test_sqlite_keeps_only_the_capped_rows(tmp_path: Path) -> None:
    broker = make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}", dead_letter_max=3)
    assert isinstance(broker, SQLiteBroker)
    dead_letter(broker, 5)
    dead_letter(broker, 2, queue="other")
    with broker._read() as conn:
        rows = conn.execute("SELECT queue, reason FROM dead ORDER BY seq").fetchall()
    assert rows == [
        ("q", "reason 2"),
        ("q", "reason 3"),
        ("q", "reason 4"),
        ("other", "reason 0"),
        ("other", "reason 1"),
    ]
    broker.close()
