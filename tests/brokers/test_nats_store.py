"""The NATS store's key listing, which worker lists and dead-worker recovery rest on: every key
written before the listing is in it, also in a bucket that already holds many keys and deleted
ones. (``KeyValue.keys()``, which listed them before, can end its replay early and report
none, or some: nats.py issue 842.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hurtle.brokers import make_broker
from hurtle.brokers.nats.broker import NatsBroker
from hurtle.brokers.nats.loop import run
from hurtle.brokers.nats.store import Store
from hurtle.ids import new_id
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures


@pytest.fixture
def store(nats_url: str) -> Iterator[Store]:  # noqa: F811 - fixture
    broker = make_broker(nats_url)
    assert isinstance(broker, NatsBroker)
    try:
        yield broker.store
    finally:
        broker.close()


def test_every_key_written_is_listed_at_once_and_a_deleted_one_reads_as_none(
    store: Store,
) -> None:
    bucket = f"test-keys-{new_id()}"

    async def rounds() -> None:
        kv = await store.kv(bucket)
        assert await store.keys(bucket) == []
        written = [f"a{i:03d}" for i in range(300)]
        for key in written:
            await kv.put(key, b"\x90")
        for key in written[:100]:
            await kv.delete(key)
        written = written[100:]
        for i in range(300):  # each listing right after a write
            written.append(f"b{i:03d}")
            await kv.put(written[-1], b"\x90")
            listed = await store.keys(bucket)
            assert set(written) <= set(listed), (i, len(listed))
        assert await store.get("a000", bucket) is None
        await kv.delete("b000")
        assert await store.get("b000", bucket) is None
        await store.js.delete_key_value(bucket)

    run(rounds())


def test_a_bucket_with_more_keys_than_one_reply_holds_is_listed_whole(store: Store) -> None:
    # the server lists at most 100,000 subjects a reply: the listing asks for the next page
    bucket = f"test-many-keys-{new_id()}"
    count = 100_000 + 1_234

    async def many() -> None:
        await store.kv(bucket)
        written = [f"k{i:06d}" for i in range(count)]
        for start in range(0, count, 2_000):  # what ``KeyValue.put`` sends, pipelined
            await asyncio.gather(
                *(store.js.publish(f"$KV.{bucket}.{k}", b"\x90") for k in written[start:][:2_000])
            )
        listed = await store.keys(bucket)
        assert len(listed) == count
        assert set(listed) == set(written)
        await store.js.delete_key_value(bucket)

    run(many())
