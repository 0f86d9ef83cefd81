"""The channel contract, shared by every backend: memory, sqlite, redis, a Redis Cluster."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from hurtle import BrokerError, ConfigurationError, EncodeError, Hurtle
from hurtle.channels import ChannelMessage, Subscription, frame


def take(sub: Subscription, n: int, timeout: float = 10) -> list[ChannelMessage]:
    """``n`` messages, or fewer if the deadline passes first."""
    got: list[ChannelMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        msg = sub.get(0.2)
        if msg is not None:
            got.append(msg)
    return got


def test_published_messages_reach_a_subscriber_in_order(app: Hurtle) -> None:
    with app.channel("prices").subscribe() as sub:
        prices = app.channel("prices")
        for i in range(2500):
            prices.publish({"sym": "ABC", "px": i})
        prices.publish_many([{"sym": "XYZ", "px": i} for i in range(500)])
        got = take(sub, 3000)
    assert [m.data["px"] for m in got] == list(range(2500)) + list(range(500))
    assert {m.channel for m in got} == {"prices"}
    assert sub.lost == 0
    assert sub.received == 3000


def test_buffered_messages_wait_for_flush_and_buffer_zero_sends_at_once(app: Hurtle) -> None:
    slow = app.channel("slow", flush_interval=3600)
    now = app.channel("now", buffer=0)
    with app.subscribe("slow", "now") as sub:
        slow.publish("buffered")
        now.publish("at once")
        first = take(sub, 1)
        assert [m.data for m in first] == ["at once"]
        slow.flush()
        assert [m.data for m in take(sub, 1)] == ["buffered"]


def test_a_burst_for_one_channel_travels_as_one_frame(app: Hurtle) -> None:
    feed = app._channels.backend.open_feed(["burst"], [])
    try:
        burst = app.channel("burst", flush_interval=3600)
        burst.publish_many(range(100))
        for i in range(100, 200):
            burst.publish(i)
        burst.flush()
        frames: list[tuple[str, Any]] = []
        deadline = time.monotonic() + 10
        while not frames and time.monotonic() < deadline:
            # a Redis feed's own mark (an empty frame of no publisher) may come first
            got = [(c, frame.decode(raw)) for c, raw in feed.receive(0.2)]
            frames = [(c, f) for c, f in got if f[0]]
    finally:
        feed.close()
    assert len(frames) == 1
    channel, (publisher, seq, unsent, values, _, number) = frames[0]
    assert (channel, publisher, seq, unsent, values) == (
        "burst",
        burst.publisher,
        0,
        0,
        list(range(200)),
    )
    assert number == 0  # the first messages of the channel's count


def test_the_buffer_is_sent_when_it_holds_buffer_messages(app: Hurtle) -> None:
    ch = app.channel("full", buffer=10, flush_interval=3600)
    with ch.subscribe() as sub:
        for i in range(25):
            ch.publish(i)
        assert [m.data for m in take(sub, 20)] == list(range(20))
        ch.flush()
        assert [m.data for m in take(sub, 5)] == list(range(20, 25))


def test_flush_interval_sends_a_partial_buffer_without_flush(app: Hurtle) -> None:
    ch = app.channel("tick", flush_interval=0.01)
    with ch.subscribe() as sub:
        ch.publish("tick")
        assert [m.data for m in take(sub, 1)] == ["tick"]


def test_patterns_receive_matching_channels_only(app: Hurtle) -> None:
    if "+cluster://" in app.settings.broker_url:  # sharded pub/sub has no patterns
        with pytest.raises(ConfigurationError, match=r"'prices\.\*' on a Redis Cluster"):
            app.subscribe("prices.*", "news")
        return
    with app.subscribe("prices.*", "news") as sub:
        for name in ("prices.a", "volumes.a", "prices.b", "news", "newsletter"):
            app.channel(name, buffer=0).publish(name)
        got = take(sub, 3)
        app.channel("end", buffer=0).publish("end")
        app.channel("news", buffer=0).publish("last")
        got += take(sub, 1)
    assert sorted(m.data for m in got) == ["last", "news", "prices.a", "prices.b"]
    assert {m.channel: m.data for m in got if m.data != "last"} == {
        "prices.a": "prices.a",
        "prices.b": "prices.b",
        "news": "news",
    }


def test_every_subscriber_receives_every_message(app: Hurtle) -> None:
    ch = app.channel("fan")
    with ch.subscribe() as one, app.subscribe("fan") as two:
        ch.publish_many(range(50))
        ch.flush()
        assert [m.data for m in take(one, 50)] == list(range(50))
        assert [m.data for m in take(two, 50)] == list(range(50))


def test_a_gap_is_counted_logged_and_reported(
    app: Hurtle, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    losses: list[tuple[str, int]] = []
    ch = app.channel("gappy", flush_interval=3600)
    with ch.subscribe(on_loss=lambda channel, n: losses.append((channel, n))) as sub:
        ch.publish_many(range(3))
        ch.flush()
        assert [m.data for m in take(sub, 3)] == [0, 1, 2]
        ch.publish_many(range(3, 10))
        with monkeypatch.context() as down:  # the broker is down for this flush
            down.setattr(app._channels.backend, "publish", _broker_down)
            with pytest.raises(BrokerError):
                ch.flush()
        ch.publish_many(range(10, 12))
        ch.flush()
        with caplog.at_level(logging.WARNING, logger="hurtle.channels"):
            assert [m.data for m in take(sub, 2)] == [10, 11]
    assert sub.lost == 7
    assert losses == [("gappy", 7)]
    assert "7 message(s)" in caplog.text and ch.publisher in caplog.text


def _broker_down(frames: object) -> None:
    raise BrokerError("the broker is down")


def test_a_repeated_frame_is_delivered_once(app: Hurtle) -> None:
    ch = app.channel("twice", flush_interval=3600)
    with ch.subscribe() as sub:
        ch.publish_many(["a", "b"])
        frames = ch.take()
        backend = app._channels.backend
        backend.publish(frames)
        backend.publish(frames)
        ch.publish("c")
        ch.flush()
        got = take(sub, 3)
        assert sub.get(0.2) is None
    assert [m.data for m in got] == ["a", "b", "c"]
    assert sub.lost == 0


def test_a_subscriber_counts_no_loss_for_messages_before_it_started(app: Hurtle) -> None:
    ch = app.channel("late", buffer=0)
    ch.publish("before")
    with ch.subscribe() as sub:
        ch.publish("after")
        assert [m.data for m in take(sub, 1)] == ["after"]
    assert sub.lost == 0


def test_close_from_another_thread_ends_the_iteration(app: Hurtle) -> None:
    sub = app.subscribe("quiet")
    seen: list[Any] = []
    reader = threading.Thread(target=lambda: seen.extend(sub))
    reader.start()
    sub.close()
    reader.join(10)
    assert not reader.is_alive()
    assert seen == []


def test_app_close_flushes_buffered_messages(url: str) -> None:
    publisher, listener = Hurtle(url), Hurtle(url)
    if url.startswith("memory"):
        listener = publisher  # memory channels live inside one app
    try:
        with listener.subscribe("closing") as sub:
            publisher.channel("closing", flush_interval=3600).publish("sent on close")
            publisher.close()
            assert [m.data for m in take(sub, 1)] == ["sent on close"]
    finally:
        listener.close()


def test_subscribe_async_receives_messages(app: Hurtle) -> None:
    async def main() -> list[Any]:
        ch = app.channel("async", buffer=0)
        got: list[Any] = []
        async with ch.subscribe_async() as sub:
            ch.publish_many(["x", "y"])
            async for msg in sub:
                got.append(msg.data)
                if len(got) == 2:
                    break
        return got

    assert asyncio.run(asyncio.wait_for(main(), 30)) == ["x", "y"]


def test_bad_values_and_names_are_refused_with_the_value(app: Hurtle) -> None:
    with pytest.raises(EncodeError, match="object"):
        app.channel("x").publish(object())
    with pytest.raises(ConfigurationError, match=r"'a\*'"):
        app.channel("a*")
    with pytest.raises(ConfigurationError, match="buffer=-1"):
        app.channel("x", buffer=-1)
    with pytest.raises(ConfigurationError, match="flush_interval=0"):
        app.channel("x", flush_interval=0)
    with pytest.raises(ConfigurationError, match="subscribe"):
        app.subscribe()


def test_a_failed_last_flush_is_counted_though_the_publisher_falls_silent(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    ch = app.channel("quiet-end", flush_interval=3600)
    with ch.subscribe() as sub:
        ch.publish("first")
        ch.flush()
        assert [m.data for m in take(sub, 1)] == ["first"]
        backend = app._channels.backend

        def down(frames: object) -> None:
            raise BrokerError("the broker is down")

        monkeypatch.setattr(backend, "publish", down)
        ch.publish_many(range(3))
        with pytest.raises(BrokerError):
            ch.flush()
        monkeypatch.undo()  # the broker is back, and the publisher publishes nothing more
        deadline = time.monotonic() + 20
        while sub.lost == 0 and time.monotonic() < deadline:
            assert sub.get(0.2) is None
    assert sub.lost == 3


def test_publishers_not_heard_from_for_long_are_forgotten(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hurtle.channels import subscription

    old, new = app.channel("gone", flush_interval=3600), app.channel("gone", buffer=0)
    with app.subscribe("gone") as sub:
        old.publish("from a publisher that then went away")
        app._channels.backend.publish(old.take())  # sent without a tail frame to follow
        assert len(take(sub, 1)) == 1
        assert sub.publishers == 1
        monkeypatch.setattr(subscription, "FORGET_AFTER", 0.0)
        monkeypatch.setattr(subscription, "SWEEP_EVERY", 0.0)
        new.publish("from another")
        assert len(take(sub, 1)) == 1
        assert sub.publishers == 1  # the first one is forgotten, the second followed
