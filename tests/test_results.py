"""Results end to end: a real worker process stores them, a test process waits on handles; many
waiters on Redis share a few connections; SQLite prunes expired records as it writes new ones."""

from __future__ import annotations

import signal
import sqlite3
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from helpers import Project, stored_batch
from hurtle import Hurtle, ResultTimeout, TaskFailed
from hurtle.brokers import (
    Consumer,
    Delivery,
    StoredResult,
    StoredResults,
    UniqueLocks,
    make_broker,
)
from hurtle.brokers.keys import RESULT_BATCHES_SUFFIX, RESULT_KEY_PREFIX
from hurtle.brokers.memory import MemoryBroker
from hurtle.brokers.redis import RESULT_CONNECTIONS, RedisBroker
from hurtle.errors import BrokerError
from hurtle.message import Message
from hurtle.worker.acker import Acker

TASKS = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="tasks.add", store_result=True)
    def add(x, y):
        return {"sum": x + y, "pair": [x, y]}


    @app.task(name="tasks.fail", store_result=True, retries=0)
    def fail(n):
        raise ValueError(f"bad input {n}")
    """
)


@pytest.fixture(params=["sqlite", "redis"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    url = str(request.getfixturevalue("redis_url")) if request.param == "redis" else None
    p = Project(tmp_path, TASKS, (), url=url)
    for name in ("tasks.add", "tasks.fail"):
        p.app.task(name=name, store_result=True, retries=0)(lambda *a: None)
    yield p
    p.app.close()


def test_a_worker_process_stores_results_that_handles_in_another_process_wait_for(
    project: Project,
) -> None:
    add, fail = project.app.tasks["tasks.add"], project.app.tasks["tasks.fail"]
    # a hundred sent before the worker starts: its first batches are big enough to be stored
    # whole where the broker does that (Redis)
    handles = add.send_many([(i, 1) for i in range(100)])
    failing = fail.send(3)
    worker = project.popen("worker", "tasks:app")
    try:
        assert [h.result(timeout=60) for h in handles] == [
            {"sum": i + 1, "pair": [i, 1]} for i in range(100)
        ]
        if project.url.startswith("redis"):
            import redis

            client = redis.Redis.from_url(project.url)
            assert client.keys(f"{RESULT_KEY_PREFIX}*{RESULT_BATCHES_SUFFIX}")  # kept whole
            client.close()
        with pytest.raises(TaskFailed) as info:
            failing.result(timeout=60)
        assert (info.value.type, info.value.message) == ("ValueError", "bad input 3")
        # sent while the worker runs: the waiter is woken (Redis) or re-reads (SQLite)
        assert add.send(40, 2).result(timeout=60) == {"sum": 42, "pair": [40, 2]}
        assert project.app.handle(failing.id).state() == "dead"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert project.stop(worker) == 0, project.output(worker)


def _clients(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list())
    finally:
        client.close()


def test_two_hundred_waiters_on_redis_share_a_few_connections(redis_url: str) -> None:
    app = Hurtle(redis_url)
    try:

        @app.task(store_result=True)
        def square(x: int) -> int:
            return x * x

        handles = square.send_many([(i,) for i in range(200)])
        before = _clients(redis_url)
        results: dict[int, Any] = {}
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, handles[i].result(60)))
            for i in range(200)
        ]
        for t in threads:
            t.start()
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        deadline = time.monotonic() + 30
        while len(broker._listener._waiters._by_id) < 200:  # every thread waits now
            assert time.monotonic() < deadline
            time.sleep(0.01)
        during = _clients(redis_url)
        worker = app.worker(queues=["default"])
        runner = worker.run_in_thread()
        try:
            for t in threads:
                t.join(60)
        finally:
            worker.stop()
            runner.join(30)
        assert results == {i: i * i for i in range(200)}
        # the listener's connection and the pool of reads, not one per waiter
        assert during - before <= RESULT_CONNECTIONS
    finally:
        app.close()


def test_sqlite_prunes_expired_results_when_it_writes_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "hurtle.db"
    broker = make_broker(f"sqlite:///{path}")
    try:
        consumer = broker.consumer(["q"])
        # the long-lived one first: when the short ones are written nothing has expired yet,
        # however slowly the machine goes
        consumer.ack((), [StoredResult("kept", b"y", 3600.0)])
        consumer.ack((), [StoredResult(f"old{i}", b"x", 0.01) for i in range(150)])

        def rows() -> int:
            with sqlite3.connect(path) as conn:
                return int(conn.execute("SELECT count(*) FROM results").fetchone()[0])

        deadline = time.monotonic() + 10
        while broker.get_result("old0") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert rows() == 151  # expired, not yet pruned: reads skip them
        consumer.ack((), [StoredResult("new1", b"z", 3600.0)])  # prunes up to 100
        consumer.ack((), [StoredResult("new2", b"z", 3600.0)])  # and the rest
        assert rows() == 3
        assert broker.get_result("kept") == b"y"
    finally:
        broker.close()


class _Recording(Consumer):
    """A memory consumer that records the ``ack`` calls it gets, and can be made unreachable."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner
        self.calls: list[tuple[int, list[str]]] = []  # (deliveries, result ids) per ack call
        self.log: list[str] = []  # every settling call, in order
        self.down = False
        self.worker_id, self.queues = inner.worker_id, inner.queues
        self.heartbeat_timeout = inner.heartbeat_timeout

    def _reach(self) -> None:
        if self.down:
            raise BrokerError("unreachable") from ConnectionError("refused")

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        return self.inner.fetch(max_count, timeout)

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        self._reach()
        self.calls.append((len(deliveries), [r.id for r in results]))
        self.log.append("ack")
        self.inner.ack(deliveries, results)

    def retry(self, delivery: Delivery, message: Message) -> None:
        self._reach()
        self.log.append("retry")
        self.inner.retry(delivery, message)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._reach()
        self.log.append("dead")
        self.inner.dead_letter(delivery, reason)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        self.inner.release(deliveries)

    def release_unique(self, locks: Sequence[tuple[str, str, str, float]]) -> None:
        self._reach()
        self.log.append("release_unique")
        self.inner.release_unique(locks)

    def heartbeat(self) -> bool:
        return self.inner.heartbeat()

    def close(self) -> None:
        self.inner.close()


def test_the_acker_stores_results_in_the_same_call_as_the_acknowledgements() -> None:
    broker = MemoryBroker()
    broker.publish([Message(id=f"m{i}", task="t", queue="q", args=()) for i in range(4)])
    consumer = _Recording(broker.consumer(["q"]))
    got = consumer.fetch(10, 1)
    acker = Acker(consumer)
    acker.ack(got[0])
    for i, d in enumerate(got[1:], 1):
        acker.ack_with_result(d, f"m{i}", b"value", 60.0)
    assert acker.flush()
    assert consumer.calls == [(4, ["m1", "m2", "m3"])]
    assert broker.get_result("m2") == b"value"
    assert broker.stats(["q"])["q"].in_flight == 0


def test_results_wait_with_their_acks_while_the_broker_is_unreachable() -> None:
    broker = MemoryBroker()
    broker.publish([Message(id="m1", task="t", queue="q", args=())])
    consumer = _Recording(broker.consumer(["q"]))
    [d] = consumer.fetch(10, 1)
    acker = Acker(consumer)
    acker.ack_with_result(d, "m1", b"value", 60.0)
    acker.store_result("m0", b"failure", 60.0)
    consumer.down = True
    assert not acker.flush()
    assert acker.pending == 2
    consumer.down = False
    assert acker.flush()
    assert (broker.get_result("m1"), broker.get_result("m0")) == (b"value", b"failure")
    assert acker.pending == 0


def test_batches_of_results_in_columns_go_in_one_call_and_wait_while_unreachable() -> None:
    broker = MemoryBroker()
    broker.publish([Message(id=f"m{i}", task="t", queue="q", args=()) for i in range(5)])
    consumer = _Recording(broker.consumer(["q"]))
    got = consumer.fetch(10, 1)
    acker = Acker(consumer)
    acker.ack_with_result(got[0], "m0", b"one by one", 60.0)
    acker.ack_many_with_results(got[1:3], StoredResults(["m1", "m2"], [b"a", b"b"], 60.0))
    acker.ack_many_with_results(got[3:], StoredResults(["m3", "m4"], [b"c", b"d"], 5.0))
    with pytest.raises(ValueError, match="1 results for 2 deliveries"):
        acker.ack_many_with_results(got[3:], StoredResults(["m3"], [b"c"], 5.0))
    consumer.down = True
    assert not acker.flush()
    assert acker.pending == 5
    consumer.down = False
    assert acker.flush()
    assert consumer.calls == [(5, ["m0", "m1", "m2", "m3", "m4"])]
    got_back = [broker.get_result(f"m{i}") for i in range(5)]
    assert got_back == [b"one by one", b"a", b"b", b"c", b"d"]
    assert acker.pending == 0
    assert broker.stats(["q"])["q"].in_flight == 0


def test_stored_results_read_as_a_sequence_of_records_and_join_by_ttl() -> None:
    a = StoredResults(["x", "y"], [b"1", b"2"], 60.0)
    assert list(a) == [StoredResult("x", b"1", 60.0), StoredResult("y", b"2", 60.0)]
    assert a[1] == StoredResult("y", b"2", 60.0)
    assert list(a[1:]) == [StoredResult("y", b"2", 60.0)] and len(a) == 2
    joined = StoredResults.join([a, StoredResults(["z"], [b"3"], 60.0)])
    assert isinstance(joined, StoredResults) and joined.ids == ["x", "y", "z"]
    mixed = StoredResults.join([a, StoredResults(["z"], [b"3"], 1.0)])
    assert mixed == [*a, StoredResult("z", b"3", 1.0)]
    with pytest.raises(ValueError):
        StoredResults(["x"], [], 1.0)


def test_a_batch_kept_whole_gives_the_bytes_of_its_records_made_one_by_one() -> None:
    from hurtle.records import SUCCEEDED, Record, _batch_decoder, decode, record_in_batch

    messages = [
        Message(id=f"m{i:03d}", task="tests.add", queue="q", args=(i, "é"), kwargs={"k": i})
        for i in range(40)
    ]
    deliveries = [Delivery("q", m.encode(), i) for i, m in enumerate(messages)]
    values: list[Any] = [{"n": i, "list": [i] * 3, "none": None} for i in range(39)] + [b"\x00"]
    whole = stored_batch(deliveries, values)
    assert whole.batches is not None and whole.batches[0].size == 40
    body = whole.batches[0].body
    batch = _batch_decoder.decode(body)
    f = batch.finished
    one_by_one = [  # the bytes of each call's Record, made the plain way
        msgspec.msgpack.encode(
            Record(
                SUCCEEDED,
                v,
                task="tests.add",
                queue=m.queue,
                args_kept=True,
                args=m.args,
                kwargs=m.kwargs,
                enqueued=m.created,
                started=f - 0.25,
                finished=f,
            )
        )
        for v, m in zip(values, messages, strict=True)
    ]
    assert whole.batches[0].payloads() == one_by_one
    assert [record_in_batch(body, k) for k in range(40)] == one_by_one
    # cut in parts of at most BATCH_MOST calls
    many = [Message(id=f"n{i:03d}", task="tests.add", queue="q", args=(i,)) for i in range(150)]
    cut = stored_batch([Delivery("q", m.encode(), 0) for m in many], list(range(150)))
    assert cut.batches is not None and [b.size for b in cut.batches] == [64, 64, 22]
    assert [decode(p).value for b in cut.batches for p in b.payloads()] == list(range(150))
    # too few calls, or a message too large to copy into records: one by one
    assert stored_batch(deliveries[:31], values[:31]).batches is None
    big = Message(id="m999", task="tests.add", queue="q", args=("x" * 5000,))
    mixed = [*deliveries[:39], Delivery("q", big.encode(), 0)]
    assert stored_batch(mixed, values).batches is None
    # joined with a part of records one by one: batches still, that part without a body
    joined = StoredResults.join([whole, StoredResults(["z"], [b"3"], 60.0)])
    assert isinstance(joined, StoredResults) and joined.batches is not None
    assert [b.body for b in joined.batches] == [body, b""]
    assert joined.ids == [m.id for m in messages] + ["z"]
    assert joined.payloads == [*one_by_one, b"3"] and joined.batches is None


def test_unique_locks_read_as_tuples_and_join_by_queue() -> None:
    a = UniqueLocks("q", ["k1", "k2"], ["m1", "m2"], [1.0, 2.0])
    assert list(a) == [("q", "k1", "m1", 1.0), ("q", "k2", "m2", 2.0)]
    assert a[1] == ("q", "k2", "m2", 2.0) and list(a[:1]) == [("q", "k1", "m1", 1.0)]
    joined = UniqueLocks.join([a, UniqueLocks("q", ["k3"], ["m3"], [3.0])])
    assert isinstance(joined, UniqueLocks) and joined.keys == ["k1", "k2", "k3"]
    other = UniqueLocks.join([a, UniqueLocks("r", ["k3"], ["m3"], [3.0])])
    assert other == [*a, ("r", "k3", "m3", 3.0)]
    mixed = UniqueLocks.join([[("q", "k0", "m0", 0.0)], a])
    assert mixed == [("q", "k0", "m0", 0.0), *a]
    with pytest.raises(ValueError):
        UniqueLocks("q", ["k"], [], [1.0])


def test_locks_in_columns_go_with_the_acks_and_wait_while_unreachable() -> None:
    broker = MemoryBroker()
    held = [
        Message(id=f"m{i}", task="t", queue="q", args=(), headers={"unique": f"k{i}"})
        for i in range(3)
    ]
    assert broker.publish_unique(held, 60) == ["m0", "m1", "m2"]
    consumer = _Recording(broker.consumer(["q"]))
    got = consumer.fetch(10, 1)
    acker = Acker(consumer)
    acker.ack_many(got)
    acker.release_unique("q", "k0", "m0", 0.0)
    acker.release_unique_batch(UniqueLocks("q", ["k1", "k2"], ["m1", "m2"], [0.0, 0.0]))
    consumer.down = True
    assert not acker.flush()
    assert acker.pending == 5  # 3 acks, one lock, one batch of locks
    consumer.down = False
    assert acker.flush()
    assert acker.pending == 0
    assert consumer.log == ["ack", "release_unique"]  # the acks first, in one flush
    again = [
        Message(id=f"n{i}", task="t", queue="q", args=(), headers={"unique": f"k{i}"})
        for i in range(3)
    ]
    assert broker.publish_unique(again, 60) == ["n0", "n1", "n2"]  # every lock was released


def test_a_failure_record_is_written_before_the_retry_it_goes_with() -> None:
    broker = MemoryBroker()
    broker.publish([Message(id="m1", task="t", queue="q", args=())])
    consumer = _Recording(broker.consumer(["q"]))
    [d] = consumer.fetch(10, 1)
    acker = Acker(consumer)
    acker.retry(d, Message(id="m1", task="t", queue="q", args=(), attempt=1))
    acker.store_result("m1", b"failed", 60.0)
    assert acker.flush()
    # else a quick next attempt could store its success first, and this record replace it
    assert consumer.log == ["ack", "retry"]
    assert consumer.calls == [(0, ["m1"])]


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_results_are_stored_by_the_other_pools_too(pool: str) -> None:
    app = Hurtle("memory://")

    @app.task(store_result=True)
    def inc(x: int) -> int:
        return x + 1

    @app.task(store_result=True)
    async def ainc(x: int) -> int:
        return x + 1

    handles = inc.send_many([(i,) for i in range(20)]) + ainc.send_many([(i,) for i in range(5)])
    worker = app.worker(pool=pool, concurrency=4)
    thread = worker.run_in_thread()
    try:
        assert [h.result(timeout=30) for h in handles] == [*range(1, 21), *range(1, 6)]
    finally:
        worker.stop()
        thread.join(30)


def test_store_results_and_result_ttl_come_from_the_environment_too() -> None:
    from hurtle.errors import ConfigurationError
    from hurtle.settings import load_settings

    s = load_settings(environ={"HURTLE_STORE_RESULTS": "true", "HURTLE_RESULT_TTL": "60"})
    assert (s.store_results, s.result_ttl) == (True, 60.0)
    with pytest.raises(ConfigurationError, match="store_results must be True or False"):
        Hurtle("memory://", store_results=1)
    with pytest.raises(ConfigurationError, match="result_ttl must be > 0"):
        Hurtle("memory://", result_ttl=0)
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match="result_ttl"):
        app.task(store_result=True, result_ttl=-1)(lambda: None)


def test_a_failure_record_reaches_the_acker_before_the_retry_or_dead_letter() -> None:
    from hurtle.worker.processor import Processor

    class LoggingAcker(Acker):
        def __init__(self, consumer: Consumer) -> None:
            super().__init__(consumer)
            self.calls: list[str] = []

        def store_result(self, message_id: str, payload: bytes, ttl: float) -> None:
            self.calls.append("record")
            super().store_result(message_id, payload, ttl)

        def retry(self, delivery: Delivery, message: Message) -> None:
            self.calls.append("retry")
            super().retry(delivery, message)

        def dead_letter(self, delivery: Delivery, reason: str) -> None:
            self.calls.append("dead")
            super().dead_letter(delivery, reason)

    app = Hurtle("memory://")

    @app.task(store_result=True, retries=1)
    def flaky() -> None:
        raise RuntimeError("no")

    h = flaky.send()
    consumer = app.broker.consumer(["default"])
    acker = LoggingAcker(consumer)
    worker = app.worker()
    processor = Processor(app, acker, worker.middleware)
    for m in worker.middleware:
        m.worker_start(type("W", (), {"acker": acker})())  # type: ignore[arg-type]
    [delivery] = consumer.fetch(10, 1)
    processor.process(delivery)  # attempt 1 of 2: a retry
    [again] = consumer.fetch(10, 0) or [None]  # the retry is delayed: nothing yet
    assert again is None
    assert acker.calls == ["record", "retry"]
    assert acker.flush()
    assert h.state() == "failed"


def _gets(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats").get("cmdstat_get", {})
        return int(stats.get("calls", 0))
    finally:
        client.close()


def test_waiting_on_redis_does_not_poll(redis_url: str) -> None:
    app = Hurtle(redis_url)
    try:

        @app.task(store_result=True)
        def never() -> None:
            pass

        h = never.send()
        before = _gets(redis_url)
        with pytest.raises(ResultTimeout):
            h.result(timeout=1.0)
        # a read once listening, again once the subscription took, at the deadline, and for
        # the timeout's message: four, where a loop of 2-50 ms sleeps would make dozens
        assert _gets(redis_url) - before <= 4
    finally:
        app.close()


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("kind", ["memory", "redis"])  # redis: a batch is stored whole
def test_one_value_nested_too_deeply_fails_its_own_call_and_the_rest_keep_their_results(
    request: pytest.FixtureRequest, kind: str
) -> None:
    url = "memory://" if kind == "memory" else str(request.getfixturevalue("redis_url"))
    app = Hurtle(url)
    try:

        @app.task(store_result=True, retries=0)
        def value(i: int) -> Any:
            return _nested(5000) if i == 20 else i

        handles = value.send_many([(i,) for i in range(41)])  # one batch
        app.worker(burst=True).run()
        with pytest.raises(TaskFailed) as info:
            handles[20].result(timeout=1)
        assert info.value.type == "ResultError"
        assert "nested too deeply" in info.value.message
        rest = handles[:20] + handles[21:]
        assert [h.result(timeout=1) for h in rest] == [*range(20), *range(21, 41)]
        stats = app.broker.stats(["default"])["default"]
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 1)
    finally:
        app.close()
