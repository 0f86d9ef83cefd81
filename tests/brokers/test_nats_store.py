"""The NATS store's key listing, which worker lists and dead-worker recovery rest on: every key
written before the listing is in it, also in a bucket that already holds many keys and deleted
ones. (``KeyValue.keys()``, which listed them before, can end its replay early and report
none, or some: nats.py issue 842.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError

from hurtle.brokers import make_broker
from hurtle.brokers.nats import names
from hurtle.brokers.nats.broker import NatsBroker
from hurtle.brokers.nats.loop import run
from hurtle.brokers.nats.store import Store
from hurtle.ids import new_id
from hurtle.message import Message
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
        # what ``KeyValue.put`` sends, published without waiting for each acknowledgement
        # (the bucket's stream stores them all the same), then the stream's count awaited
        for k in written:
            await store.nc.publish(f"$KV.{bucket}.{k}", b"\x90")
        await store.nc.flush()
        deadline = time.monotonic() + 60
        while (await store.js.stream_info(f"KV_{bucket}")).state.messages < count:
            assert time.monotonic() < deadline, "the bucket's stream did not store every key"
            await asyncio.sleep(0.05)
        listed = await store.keys(bucket)
        assert len(listed) == count
        assert set(listed) == set(written)
        await store.js.delete_key_value(bucket)

    run(many())


def test_dead_letters_written_before_ids_still_list_and_delete_by_their_sequence(
    nats_url: str,  # noqa: F811 - fixture
) -> None:
    broker = make_broker(nats_url)
    assert isinstance(broker, NatsBroker)
    js = broker.store.js
    when = time.time()

    async def old_form() -> None:  # the stream and the dead letter as they were written
        await js.add_stream(
            api.StreamConfig(name="HD_q", subjects=["hd.q"], retention=api.RetentionPolicy.LIMITS)
        )
        headers = {"Hurtle-Reason": "old reason", "Hurtle-Failed-At": repr(when)}
        await js.publish("hd.q", b"old bytes", headers=headers)

    try:
        run(old_form())
        broker.publish([Message(id="m1", task="t", queue="q", args=())])
        c = broker.consumer(["q"])
        [d] = c.fetch(1, 1)
        c.dead_letter(d, "new\nreason")
        old, new = broker.dead_letters("q")
        assert (old.id, old.reason, old.raw, old.failed_at) == (
            "1",
            "old reason",
            b"old bytes",
            when,
        )
        assert (new.reason, len(new.id)) == ("new\nreason", 24)
        assert broker.delete_dead("q", ["1", "2"]) == 1  # "2" is the new one's sequence: no id
        assert broker.dead_letters("q") == [new]
        c.close()
    finally:
        broker.close()


def test_over_max_payload_an_argument_is_an_encode_error_and_a_result_fails_its_call(
    nats_url: str,  # noqa: F811 - fixture
) -> None:
    from hurtle import EncodeError, Hurtle, TaskFailed

    app = Hurtle(nats_url)
    try:

        @app.task(store_result=True, retries=0)
        def blob(data: bytes, n: int) -> bytes:
            return b"x" * n

        two_mb = 2 * 1024 * 1024  # over the server's max_payload (1 MB)
        with pytest.raises(EncodeError, match="max_message_size"):
            blob.send(b"x" * two_mb, 0)
        big, small = blob.send(b"", two_mb), blob.send(b"", 3)
        worker = app.worker(burst=True)
        thread = worker.run_in_thread()
        with pytest.raises(TaskFailed, match="max_result_size"):
            big.result(timeout=30)
        assert small.result(timeout=30) == b"xxx"
        thread.join(30)
        assert not thread.is_alive()  # a burst worker ends: nothing is left in flight
        stats = app.broker.stats(["default"])["default"]
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 1)
    finally:
        app.close()


def test_a_batch_publish_waits_for_every_acknowledgement_and_raises_a_refusal(
    store: Store,
) -> None:
    queue = f"pub-{new_id()}"
    subject = names.subject(queue, "0")

    async def rounds() -> None:
        await store.ensure_queue(queue)
        await store.publish_all([(subject, bytes([i % 256]), None) for i in range(2500)])
        info = await store.js.stream_info(names.stream(queue))
        assert info.state.messages == 2500
        with pytest.raises(APIError, match="expected stream"):  # one refused among many
            await store.publish_all(
                [(subject, b"a", None), (subject, b"b", {"Nats-Expected-Stream": "nope"})]
            )
        with pytest.raises(NoStreamResponseError):  # a subject no stream takes
            await store.publish_all([(f"nowhere.{new_id()}", b"c", None)])
        info = await store.js.stream_info(names.stream(queue))
        assert info.state.messages == 2501

    run(rounds())
