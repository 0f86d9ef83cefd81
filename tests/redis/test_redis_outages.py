"""What the Redis broker does when its server dies, restarts or is not there at all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("redis")

from helpers import Project
from hurtle.brokers import Delivery, make_broker
from hurtle.errors import BrokerError
from hurtle.ids import new_id
from hurtle.message import Message
from test_cli import TASKS

MakeServer = Callable[..., Any]


def msg(i: int, queue: str = "q") -> Message:
    return Message(id=new_id(), task="t", queue=queue, args=(i,))


def numbers(deliveries: list[Delivery]) -> list[int]:
    return [int(Message.decode(d.raw).args[0]) for d in deliveries]


def test_redis_restarted_with_aof_loses_nothing_published_and_keeps_nothing_acked(
    make_redis_server: MakeServer,
) -> None:
    server = make_redis_server(appendonly=True)
    broker = make_broker(server.url)
    try:
        broker.publish([msg(i) for i in range(100)])
        consumer = broker.consumer(["q"], worker_id="w1")
        held = consumer.fetch(30, 1.0)
        consumer.ack(held[:20])  # 20 done, 10 still held, 70 ready

        server.kill()  # SIGKILL: only what the AOF holds survives
        server.start()  # same port, same directory

        # The same broker reconnects by itself; the scripts are loaded again.
        stats = broker.stats(["q"])["q"]
        assert (stats.ready, stats.in_flight) == (70, 10)
        consumer.close()  # hands back the 10 it held
        rest = broker.consumer(["q"]).fetch(1000, 1.0)
        assert sorted(numbers(rest)) == list(range(20, 100))
    finally:
        broker.close()


def test_publish_while_redis_is_down_raises_broker_error_naming_the_url(
    make_redis_server: MakeServer,
) -> None:
    server = make_redis_server()
    broker = make_broker(server.url)
    server.kill()
    try:
        with pytest.raises(BrokerError, match="cannot reach Redis at") as info:
            broker.publish([msg(1)])
        assert server.url in str(info.value)
        assert info.value.__cause__ is not None
    finally:
        broker.close()


def test_fetch_raises_broker_error_when_redis_goes_away(make_redis_server: MakeServer) -> None:
    server = make_redis_server()
    broker = make_broker(server.url)
    try:
        consumer = broker.consumer(["q"])
        broker.publish([msg(1)])
        assert numbers(consumer.fetch(10, 1.0)) == [1]
        server.kill()
        with pytest.raises(BrokerError, match="cannot reach Redis at"):
            consumer.fetch(10, 1.0)
    finally:
        broker.close()


def test_a_consumer_blocked_in_fetch_gets_broker_error_when_redis_dies(
    make_redis_server: MakeServer,
) -> None:
    server = make_redis_server()
    broker = make_broker(server.url)
    errors: list[BaseException] = []
    try:
        consumer = broker.consumer(["q"])

        def wait() -> None:
            try:
                consumer.fetch(10, 30.0)
            except BaseException as err:
                errors.append(err)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)  # blocked in BLPOP
        killed = time.monotonic()
        server.kill()
        thread.join(10)
        assert not thread.is_alive()
        assert time.monotonic() - killed < 5
        assert len(errors) == 1 and isinstance(errors[0], BrokerError)
        assert server.url in str(errors[0])
    finally:
        broker.close()


def test_the_first_publish_after_redis_restarted_goes_through(
    make_redis_server: MakeServer,
) -> None:
    server = make_redis_server(appendonly=True)
    broker = make_broker(server.url)
    try:
        broker.publish([msg(1)])  # the pooled connection it used dies with the server
        server.kill()
        server.start()
        broker.publish([msg(2)])  # on a new connection: the caller sees no error
        assert sorted(numbers(broker.consumer(["q"]).fetch(10, 1.0))) == [1, 2]
    finally:
        broker.close()


def test_a_consumer_works_again_once_redis_is_back(make_redis_server: MakeServer) -> None:
    server = make_redis_server(appendonly=True)
    broker = make_broker(server.url)
    try:
        consumer = broker.consumer(["q"])
        server.kill()
        with pytest.raises(BrokerError):
            consumer.fetch(1, 0.1)
        server.start()
        broker.publish([msg(1)])
        assert numbers(consumer.fetch(1, 1.0)) == [1]
    finally:
        broker.close()


def test_a_retry_into_another_queue_that_redis_refuses_keeps_the_delivery(
    make_redis_server: MakeServer,
) -> None:
    import redis

    server = make_redis_server()
    broker = make_broker(server.url)
    admin = redis.Redis.from_url(server.url)
    try:
        m = msg(1, queue="a")
        broker.publish([m])
        consumer = broker.consumer(["a"])
        [held] = consumer.fetch(1, 1.0)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)  # every write that needs memory is refused (OOM)
        elsewhere = msgspec.structs.replace(m, queue="b", attempt=1)
        with pytest.raises(BrokerError, match="maxmemory"):
            consumer.retry(held, elsewhere)
        admin.config_set("maxmemory", 0)
        stats = broker.stats(["a", "b"])
        assert (stats["a"].in_flight, stats["b"].ready) == (1, 0)  # still held, in one place
        consumer.retry(held, elsewhere)  # the acker tries again once Redis takes writes
        stats = broker.stats(["a", "b"])
        assert (stats["a"].in_flight, stats["b"].ready) == (0, 1)
    finally:
        admin.close()
        broker.close()


def test_prefetch_while_redis_is_down_raises_nothing_and_fetch_works_once_it_is_back(
    make_redis_server: MakeServer,
) -> None:
    server = make_redis_server(appendonly=True)
    broker = make_broker(server.url)
    try:
        broker.publish([msg(i) for i in range(3)])
        consumer = broker.consumer(["q"])
        assert numbers(consumer.fetch(1, 1.0)) == [0]
        server.kill()
        consumer.prefetch(10)  # a solo worker calls it right after a fetch: it must not raise
        with pytest.raises(BrokerError, match="cannot reach Redis at"):
            consumer.fetch(10, 0.1)
        server.start()
        consumer.prefetch(10)
        assert numbers(consumer.fetch(10, 1.0)) == [1, 2]
    finally:
        broker.close()


def test_a_solo_worker_rides_out_redis_restarts_and_runs_every_task(
    make_redis_server: MakeServer, tmp_path: Path
) -> None:
    server = make_redis_server(appendonly=True)
    project = Project(tmp_path, TASKS, ("tasks.slow",), url=server.url)
    total, restarts = 3000, 5
    try:
        project.app.tasks["tasks.slow"].send_many([(i, 0.002) for i in range(total)])
        worker = project.popen("worker", "tasks:app", "--pool", "solo", "--burst")
        for k in range(1, restarts + 1):
            project.wait_for(lambda k=k: len(project.lines("done")) >= k * total // 8)
            assert worker.poll() is None, project.output(worker)
            failures = project.output(worker).count("fetch failed")
            server.kill()
            # wait until the worker has met the dead server, then bring it back on the same port
            project.wait_for(
                lambda f=failures: (
                    project.output(worker).count("fetch failed") > f or worker.poll() is not None
                )
            )
            assert worker.poll() is None, project.output(worker)
            server.start()
        assert project.stop(worker, timeout=120) == 0, project.output(worker)
        assert set(project.lines("done")) == {str(i) for i in range(total)}
        assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0}
    finally:
        project.app.close()
