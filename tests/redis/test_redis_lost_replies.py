"""Replies lost on the way back: the server ran a script, the client never heard of it.

A small TCP proxy sits between the broker and a real ``redis-server``. Told to, it passes a
command through, lets the server run it, and then closes the client's connection instead of
handing over the reply — what a dropped connection or a restarted proxy does to a real worker.
redis-py then sends the command once more on a new connection; the broker must make that, and
its own later tries, come out right: nothing taken stays stranded in a live worker.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis")

from helpers import Project, RedisServer
from hurtle.brokers import Delivery, QueueStats, Ride, make_broker
from hurtle.brokers.redis import RedisBroker, _get_scripts
from hurtle.errors import BrokerError
from hurtle.ids import new_id
from hurtle.message import Message
from test_cli import TASKS

FETCH = _get_scripts().fetch.sha.encode()


class ReplyDropper:
    """A TCP proxy to ``port`` that can lose the replies to commands containing some bytes."""

    def __init__(self, port: int) -> None:
        self._target = ("127.0.0.1", port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._marker = b""
        self._to_drop = 0
        #: How many replies were lost so far.
        self.dropped = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_replies(self, marker: bytes, times: int) -> None:
        """Lose the replies to the next ``times`` commands that contain ``marker``."""
        with self._lock:
            self._marker, self._to_drop = marker, times

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self._target)
        armed = False  # the command in flight on this connection is to lose its reply
        with selectors.DefaultSelector() as sel, client, upstream:
            sel.register(client, selectors.EVENT_READ)
            sel.register(upstream, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.fileobj is client:
                        with self._lock:
                            if self._to_drop and self._marker in data:
                                self._to_drop -= 1
                                armed = True
                        upstream.sendall(data)
                    elif armed and data.startswith(b"-NOSCRIPT"):
                        with self._lock:  # the script did not run: lose the next reply instead
                            self._to_drop += 1
                        armed = False
                        client.sendall(data)
                    elif armed:  # the script ran; its reply goes nowhere
                        with self._lock:
                            self.dropped += 1
                        client.shutdown(socket.SHUT_RDWR)
                        return
                    else:
                        client.sendall(data)


@pytest.fixture
def server(make_redis_server: type[RedisServer]) -> RedisServer:
    return make_redis_server()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[ReplyDropper]:
    p = ReplyDropper(server.port)
    yield p
    p.close()


@pytest.fixture
def direct(server: RedisServer) -> Iterator[RedisBroker]:
    b = make_broker(server.url)
    assert isinstance(b, RedisBroker)
    yield b
    b.close()


@pytest.fixture
def through(proxy: ReplyDropper) -> Iterator[RedisBroker]:
    b = make_broker(proxy.url)
    assert isinstance(b, RedisBroker)
    yield b
    b.close()


def publish(broker: RedisBroker, n: int) -> None:
    broker.publish([Message(id=new_id(), task="t", queue="q", args=(i,)) for i in range(n)])


def numbers(deliveries: list[Delivery]) -> list[int]:
    return [int(Message.decode(d.raw).args[0]) for d in deliveries]


def test_a_fetch_whose_reply_is_lost_once_returns_its_batch_on_the_automatic_resend(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper
) -> None:
    consumer = through.consumer(["q"])
    consumer.fetch(1, 0)  # nothing there yet; loads the script
    publish(direct, 5)
    proxy.drop_replies(FETCH, 1)
    got = consumer.fetch(10, 1.0)
    assert proxy.dropped == 1
    assert numbers(got) == [0, 1, 2, 3, 4]
    assert direct.stats(["q"])["q"] == QueueStats(in_flight=5)
    consumer.ack(got)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_a_batch_whose_reply_never_arrived_is_handed_out_by_the_next_fetch(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper
) -> None:
    consumer = through.consumer(["q"])
    consumer.fetch(1, 0)
    publish(direct, 5)
    proxy.drop_replies(FETCH, 2)  # the first try and redis-py's one resend
    with pytest.raises(BrokerError):
        consumer.fetch(3, 1.0)
    assert proxy.dropped == 2
    assert direct.stats(["q"])["q"] == QueueStats(ready=2, in_flight=3)  # taken, unknown
    got = consumer.fetch(10, 1.0)
    assert numbers(got) == [0, 1, 2, 3, 4]
    consumer.ack(got)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_a_prefetch_whose_reply_is_lost_strands_nothing(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper
) -> None:
    publish(direct, 5)
    consumer = through.consumer(["q"])
    first = consumer.fetch(2, 1.0)
    proxy.drop_replies(FETCH, 1)
    consumer.prefetch(10)
    rest = consumer.fetch(10, 1.0)
    assert proxy.dropped == 1
    assert numbers(first + rest) == [0, 1, 2, 3, 4]
    consumer.ack(first + rest)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_acknowledgements_that_ride_a_prefetch_are_recorded_in_its_round_trip(
    direct: RedisBroker,
) -> None:
    publish(direct, 5)
    consumer = direct.consumer(["q"])
    assert consumer.acks_ride_prefetch
    given_back: list[Delivery] = []
    consumer.unsettled_acks = lambda ride: given_back.extend(ride.deliveries)
    first = consumer.fetch(2, 1.0)
    assert consumer.prefetch_with_acks(10, Ride(first))
    rest = consumer.fetch(10, 1.0)
    assert numbers(first + rest) == [0, 1, 2, 3, 4]
    assert given_back == []
    assert direct.stats(["q"])["q"] == QueueStats(in_flight=3)  # the first two are settled
    consumer.ack(rest)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_acknowledgements_riding_a_prefetch_whose_reply_is_lost_go_back_to_be_recorded(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper
) -> None:
    publish(direct, 5)
    consumer = through.consumer(["q"])
    given_back: list[Delivery] = []
    consumer.unsettled_acks = lambda ride: given_back.extend(ride.deliveries)
    first = consumer.fetch(2, 1.0)
    proxy.drop_replies(FETCH, 1)
    assert consumer.prefetch_with_acks(10, Ride(first))
    rest = consumer.fetch(10, 1.0)
    assert proxy.dropped == 1
    assert numbers(rest) == [2, 3, 4]
    assert numbers(given_back) == [0, 1]  # recorded or not: not known, so recorded again
    consumer.ack(given_back + rest)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_a_ride_with_records_and_locks_whose_reply_is_lost_goes_back_whole_to_the_acker(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper
) -> None:
    from hurtle.brokers import StoredResults, UniqueLocks
    from hurtle.worker import rides
    from hurtle.worker.acker import Acker

    publish(direct, 5)
    consumer = through.consumer(["q"])
    acker = Acker(consumer)  # not started: flushed here, by hand
    consumer.unsettled_acks = lambda ride: rides.give_back(acker, ride)
    first = consumer.fetch(3, 1.0)
    acker.ack_many_with_results(first[:2], StoredResults(["r0", "r1"], [b"a", b"b"], 60.0))
    acker.ack(first[2])
    acker.release_unique_batch(UniqueLocks("q", ["k"], ["r0"], [time.time() + 60]))
    ride = acker.take_ride()
    assert (len(ride.deliveries), len(ride.results), len(ride.locks)) == (3, 2, 1)
    assert acker.pending == 0
    proxy.drop_replies(FETCH, 1)
    assert consumer.prefetch_with_acks(10, ride)
    rest = consumer.fetch(10, 1.0)
    assert proxy.dropped == 1 and numbers(rest) == [3, 4]
    assert acker.pending == 4  # recorded or not, not known: the acker's again, whole
    assert acker.flush()
    assert (direct.get_result("r0"), direct.get_result("r1")) == (b"a", b"b")
    consumer.ack(rest)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_acknowledgements_riding_a_prefetch_to_a_server_without_the_script_go_back(
    direct: RedisBroker, server: RedisServer
) -> None:
    import redis

    publish(direct, 8)
    consumer = direct.consumer(["q"])
    given_back: list[Delivery] = []
    consumer.unsettled_acks = lambda ride: given_back.extend(ride.deliveries)
    first = consumer.fetch(2, 1.0)
    assert consumer.prefetch_with_acks(2, Ride(first))
    second = consumer.fetch(2, 1.0)
    assert given_back == []
    client = redis.Redis.from_url(server.url)
    try:
        client.script_flush()  # what a restarted server forgot
    finally:
        client.close()
    assert consumer.prefetch_with_acks(2, Ride(second))
    third = consumer.fetch(2, 1.0)  # the fetch script is loaded again and runs
    assert numbers(third) == [4, 5]
    assert numbers(given_back) == [2, 3]  # not recorded: the acker's again
    assert direct.stats(["q"])["q"] == QueueStats(ready=2, in_flight=4)
    assert consumer.prefetch_with_acks(2, Ride(given_back + third))  # the script is sent first
    last = consumer.fetch(2, 1.0)
    assert numbers(last) == [6, 7]
    assert numbers(given_back) == [2, 3]  # nothing more came back
    assert direct.stats(["q"])["q"] == QueueStats(in_flight=2)
    consumer.ack(last)
    assert direct.stats(["q"])["q"] == QueueStats()


def test_a_consumer_that_closes_leaves_no_key_of_its_own(
    direct: RedisBroker, server: RedisServer
) -> None:
    import redis

    publish(direct, 3)
    consumer = direct.consumer(["q"])
    consumer.ack(consumer.fetch(2, 1.0))
    consumer.close()
    client = redis.Redis.from_url(server.url)
    try:
        keys = {k.decode() for k in client.keys("*")}
    finally:
        client.close()
    assert not [k for k in keys if consumer.worker_id in k]


@pytest.mark.parametrize("lost", [1, 3])
def test_a_burst_worker_whose_fetch_replies_are_lost_runs_everything_and_exits(
    tmp_path: Path, proxy: ReplyDropper, lost: int
) -> None:
    project = Project(tmp_path, TASKS, ("tasks.slow",), url=proxy.url)
    try:
        project.app.tasks["tasks.slow"].send_many([(i, 0) for i in range(300)])
        proxy.drop_replies(FETCH, lost)
        out = project.hurtle("worker", "tasks:app", "--burst", timeout=60)
        assert out.returncode == 0, out.stderr
        assert proxy.dropped == lost
        assert set(project.lines("done")) == {str(i) for i in range(300)}
        assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}
    finally:
        project.app.close()


def test_a_publish_whose_reply_is_lost_is_stored_at_least_once(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper
) -> None:
    through.publish([Message(id=new_id(), task="t", queue="q")])  # loads the scripts
    direct.consumer(["q"]).fetch(10, 0)
    ms = [Message(id=new_id(), task="t", queue="q", args=(i,)) for i in range(5)]
    proxy.drop_replies(_get_scripts().publish.sha.encode(), 1)
    through.publish(ms)  # resent once by the client: it returns, maybe stored twice
    assert proxy.dropped == 1
    got = direct.consumer(["q"]).fetch(100, 1.0)
    assert {Message.decode(d.raw).id for d in got} == {m.id for m in ms}
    assert len(got) in (5, 10)  # duplicates allowed, never a loss (see the module docstring)


@pytest.mark.parametrize("lost", [1, 2])
@pytest.mark.parametrize("outcome", ["retry", "dead letter"])
def test_a_settle_whose_reply_is_lost_counts_once(
    direct: RedisBroker, through: RedisBroker, proxy: ReplyDropper, outcome: str, lost: int
) -> None:
    """One lost reply: the client resends the command. Two: the call raises, and the caller
    (the acker) sends it again, with a new dead-letter id."""
    scripts = _get_scripts()
    publish(direct, 2)
    consumer = through.consumer(["q"])
    held = consumer.fetch(2, 1.0)
    m = Message.decode(held[0].raw)
    nxt = Message(id=m.id, task="t", queue="q", args=m.args, attempt=1)

    def settle() -> None:
        if outcome == "retry":
            consumer.retry(held[0], nxt)
        else:
            consumer.dead_letter(held[0], "second")

    # the first settle loads the script; the second one loses its reply
    if outcome == "retry":
        consumer.retry(held[1], Message(id=new_id(), task="t", queue="q", attempt=1))
        proxy.drop_replies(scripts.retry.sha.encode(), lost)
        expected = QueueStats(ready=2)
    else:
        consumer.dead_letter(held[1], "first")
        proxy.drop_replies(scripts.dead_letter.sha.encode(), lost)
        expected = QueueStats(dead=2)
    if lost == 1:
        settle()
    else:
        with pytest.raises(BrokerError):
            settle()
        settle()
    assert proxy.dropped == lost
    assert direct.stats(["q"])["q"] == expected
