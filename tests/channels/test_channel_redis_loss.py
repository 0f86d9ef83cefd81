"""A Redis subscriber that loses its connection subscribes again and counts what it missed."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hurtle import Hurtle

redis = pytest.importorskip("redis")

Send = Callable[[int, str], None]


def kill_subscribers(client: redis.Redis, send: Send) -> None:
    assert client.client_kill_filter(_type="pubsub") >= 1


def overflow_subscribers(client: redis.Redis, send: Send) -> None:
    # A subscriber that does not read while a big burst arrives passes the (tiny) output buffer
    # limit and Redis closes its connection, as it does to any slow subscriber.
    client.config_set("client-output-buffer-limit", "pubsub 4096 0 0")
    send(20_000, "x" * 100)


@pytest.mark.parametrize(
    "cut", [kill_subscribers, overflow_subscribers], ids=["client-kill", "output-buffer-limit"]
)
def test_a_cut_subscriber_reconnects_and_counts_the_loss(
    make_redis_server: Callable[[], object], cut: Callable[[redis.Redis, Send], None]
) -> None:
    server = make_redis_server()
    url = server.url  # type: ignore[attr-defined]
    app = Hurtle(url)
    client = redis.Redis.from_url(url)
    ticks = app.channel("ticks", flush_interval=3600)
    count = 0

    def send(n: int, pad: str = "") -> None:
        nonlocal count
        ticks.publish_many([(i, pad) for i in range(count, count + n)])
        ticks.flush()
        count += n

    try:
        with ticks.subscribe() as sub:
            send(1)
            first = sub.get(10)
            assert first is not None and first.data == [0, ""]  # the baseline is known
            received = [0]
            cut(client, send)
            send(5)  # published while the subscriber is cut off, or behind in its buffer
            deadline = time.monotonic() + 30
            while sub.lost == 0 and time.monotonic() < deadline:
                send(1)
                while (msg := sub.get(0.1)) is not None:
                    received.append(msg.data[0])
            assert sub.reconnects >= 1
            assert sub.lost > 0
            send(1)  # one more, received once the subscription is back
            while received[-1] != count - 1 and time.monotonic() < deadline:
                while (msg := sub.get(0.1)) is not None:
                    received.append(msg.data[0])
            # Every message sent was either received or counted as lost.
            assert received == sorted(set(received))
            assert len(received) + sub.lost == count
    finally:
        client.close()
        app.close()


def test_a_cut_subscriber_counts_what_it_missed_though_the_publisher_has_closed(
    make_redis_server: Callable[[], object],
) -> None:
    server = make_redis_server()
    url = server.url  # type: ignore[attr-defined]
    listener, publisher = Hurtle(url), Hurtle(url)
    client = redis.Redis.from_url(url)
    try:
        with listener.subscribe("last-words") as sub:
            ch = publisher.channel("last-words", flush_interval=3600)
            ch.publish("first")
            ch.flush()
            first = sub.get(10)
            assert first is not None and first.data == "first"
            assert client.client_kill_filter(_type="pubsub") >= 1
            ch.publish_many(range(5))
            publisher.close()  # flushed, and gone: no later frame will show the gap
            deadline = time.monotonic() + 20
            while sub.lost == 0 and time.monotonic() < deadline:
                assert sub.get(0.2) is None
            assert sub.lost == 5
            assert sub.reconnects == 1
    finally:
        client.close()
        listener.close()


@pytest.fixture(params=["redis", "redis-cluster"])
def cut_url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    return str(request.getfixturevalue("redis_url"))


def on_every_node(url: str, command: Callable[[redis.Redis], int]) -> int:
    """``command`` run on the server, or on every node of a cluster; the sum of its replies."""
    if "+cluster://" in url:
        cluster = redis.RedisCluster.from_url(url.replace("+cluster", ""))
        try:
            return sum(command(cluster.get_redis_connection(n)) for n in cluster.get_nodes())
        finally:
            cluster.close()
    client = redis.Redis.from_url(url)
    try:
        return command(client)
    finally:
        client.close()


def kill_pubsub_clients(url: str) -> int:
    """``CLIENT KILL TYPE pubsub`` on the server, or on every node of a cluster."""
    return on_every_node(url, lambda c: int(c.client_kill_filter(_type="pubsub")))


def test_a_cut_subscriber_counts_the_messages_of_a_publisher_it_never_heard_from(
    cut_url: str,
) -> None:
    listener, old, new = Hurtle(cut_url), Hurtle(cut_url), Hurtle(cut_url)
    try:
        with listener.subscribe("ticks") as sub:
            heard = old.channel("ticks", flush_interval=3600)
            heard.publish("first")
            heard.flush()
            first = sub.get(10)
            assert first is not None and first.data == "first"
            assert kill_pubsub_clients(cut_url) >= 1
            heard.publish_many(range(50))
            heard.flush()
            unheard = new.channel("ticks", flush_interval=3600)  # a publisher never heard from
            unheard.publish_many(range(50))
            unheard.flush()
            received = 1
            deadline = time.monotonic() + 10
            while received + sub.lost < 101 and time.monotonic() < deadline:
                if sub.get(0.2) is not None:
                    received += 1
            for ch in (heard, unheard):  # both are heard from now
                ch.publish("after")
                ch.flush()
            while received < 3 and time.monotonic() < deadline + 10:
                if sub.get(0.2) is not None:
                    received += 1
            assert sub.reconnects == 1
            assert (received, sub.lost) == (3, 100)
    finally:
        for app in (listener, old, new):
            app.close()


def test_frames_are_numbered_and_sent_after_the_server_forgot_its_scripts(cut_url: str) -> None:
    app = Hurtle(cut_url)
    try:
        with app.subscribe("forgetful") as sub:
            ch = app.channel("forgetful", flush_interval=3600)
            ch.publish_many(["a", "b"])
            ch.flush()
            assert on_every_node(cut_url, lambda c: int(c.script_flush())) >= 1
            ch.publish("c")
            ch.flush()
            got: list[object] = []
            deadline = time.monotonic() + 10
            while len(got) < 3 and time.monotonic() < deadline:
                if (msg := sub.get(0.2)) is not None:
                    got.append(msg.data)
        assert got == ["a", "b", "c"]
        assert sub.lost == 0
    finally:
        app.close()
