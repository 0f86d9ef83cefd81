"""Redis's side of debounced tasks that the conformance suite cannot see: the queue's
``latest-replaced`` flag, raised when a debounce record replaces another call's and read by the
fetch script (``Consumer.unreplaced``), which spares the worker its read of the records while
no call of the queue was replaced."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

pytest.importorskip("redis")

import redis
from hurtle import Hurtle
from hurtle.brokers.keys import queue_keys
from hurtle.brokers.redis import RedisBroker
from hurtle.debounce import latest_value
from hurtle.ids import new_id
from hurtle.message import Message
from hurtle.middleware.debounce import DebounceMiddleware

QUEUE = "debounced"


def fetch_one(broker: RedisBroker, *queues: str) -> frozenset[str]:
    """Publish a message to the first queue, fetch it, and say what the fetch said."""
    broker.publish([Message(id=new_id(), task="t", queue=queues[0])])
    consumer = broker.consumer(list(queues))
    try:
        batch = consumer.fetch(10, 1.0)
        assert len(batch) == 1
        consumer.ack(batch)
        return consumer.unreplaced
    finally:
        consumer.close()


def test_a_fetch_says_no_call_was_replaced_until_a_record_replaces_another_calls(
    broker: RedisBroker, client: redis.Redis
) -> None:
    first, other = latest_value(new_id(), 1.0), latest_value(new_id(), 1.0)
    assert fetch_one(broker, "q") == {"q"}  # no record at all
    broker.put_latest([("q", "t:a", first), ("q", "t:b", other)], 60)
    assert fetch_one(broker, "q") == {"q"}  # each key's first record replaces none
    broker.put_latest([("q", "t:a", first)], 60)  # the same call's record again
    assert fetch_one(broker, "q") == {"q"}
    assert fetch_one(broker, "other") == {"other"}
    broker.put_latest([("q", "t:a", latest_value(new_id(), 2.0))], 60)
    assert fetch_one(broker, "q") == frozenset()  # the first call may have been replaced
    assert fetch_one(broker, "other") == {"other"}  # per queue
    # the flag lives as long as the record that replaced: at least its ttl
    assert cast(int, client.pttl(queue_keys("q").replaced)) > 50_000


def test_a_key_twice_in_one_call_raises_the_flag_and_the_last_of_it_wins(
    broker: RedisBroker,
) -> None:
    earlier, later = latest_value(new_id(), 1.0), latest_value(new_id(), 2.0)
    broker.put_latest([("q", "t:a", earlier), ("q", "t:a", later)], 60)
    assert broker.get_latest("q", ["t:a"]) == [later]
    assert fetch_one(broker, "q") == frozenset()


def test_a_raised_flag_is_only_ever_lengthened_by_a_record(
    broker: RedisBroker, client: redis.Redis
) -> None:
    mine = latest_value(new_id(), 1.0)
    broker.put_latest([("q", "t:a", latest_value(new_id(), 0.5))], 60)
    broker.put_latest([("q", "t:a", mine)], 60)
    flag = queue_keys("q").replaced
    assert cast(int, client.pttl(flag)) > 50_000
    broker.put_latest([("q", "t:b", latest_value(new_id(), 1.0))], 1)  # replaces none
    broker.put_latest([("q", "t:a", mine)], 3600)  # its own again, for longer: kept as long
    assert cast(int, client.pttl(flag)) > 3_000_000
    broker.put_latest([("q", "t:c", latest_value(new_id(), 1.0))], 1)
    broker.put_latest([("q", "t:c", latest_value(new_id(), 2.0))], 1)  # a shorter one
    assert cast(int, client.pttl(flag)) > 3_000_000


def test_a_consumer_of_several_queues_never_says(broker: RedisBroker) -> None:
    assert fetch_one(broker, "q", "r") == frozenset()


def mgets(client: redis.Redis) -> int:
    stats = cast(dict[str, Any], client.info("commandstats"))
    return int(stats.get("cmdstat_mget", {}).get("calls", 0))


def test_a_worker_reads_the_records_only_once_some_call_was_replaced(
    redis_url: str, client: redis.Redis
) -> None:
    ran: list[tuple[str, int]] = []
    app = Hurtle(redis_url, heartbeat_timeout=5.0)

    @app.task(name="deb.touch", queue=QUEUE, debounce=0.2, debounce_key="key")
    def touch(key: str, n: int) -> int:
        ran.append((key, n))
        return n

    try:
        client.config_resetstat()
        touch.send_many([(f"k{n}", n) for n in range(20)])  # each its own key
        time.sleep(0.3)
        app.worker(burst=True, queues=[QUEUE]).run()
        assert sorted(ran) == sorted((f"k{n}", n) for n in range(20))
        assert mgets(client) == 0  # no record replaced another: none was read
        ran.clear()
        touch.send("k1", 100)  # replaces k1's record: the next batch's records are read
        touch.send("k1", 101)
        touch.send("k2", 102)
        time.sleep(0.3)
        app.worker(burst=True, queues=[QUEUE]).run()
        assert sorted(ran) == [("k1", 101), ("k2", 102)]
        assert mgets(client) >= 1
    finally:
        app.close()


def test_the_debounce_middleware_reads_before_calls_only_once_a_call_was_replaced(
    broker: RedisBroker,
) -> None:
    consumer = broker.consumer(["q"])
    middleware = DebounceMiddleware()
    middleware.worker_start(
        cast(Any, SimpleNamespace(app=SimpleNamespace(broker=broker), consumer=consumer))
    )
    try:
        assert middleware.reads_before_calls()  # nothing fetched yet: it cannot tell
        broker.publish([Message(id=new_id(), task="t", queue="q") for _ in range(2)])
        consumer.ack(consumer.fetch(1, 1.0))
        assert not middleware.reads_before_calls()  # the solo worker prefetches at once
        broker.put_latest([("q", "t:a", latest_value(new_id(), 1.0))], 60)
        broker.put_latest([("q", "t:a", latest_value(new_id(), 2.0))], 60)
        consumer.ack(consumer.fetch(1, 1.0))
        assert middleware.reads_before_calls()
    finally:
        consumer.close()
