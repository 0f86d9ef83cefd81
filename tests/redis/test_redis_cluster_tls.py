"""``rediss+cluster://``: a Redis Cluster that speaks only TLS (clients, bus, replication), with
a certificate of a throwaway CA; the URL names the CA with redis-py's ``ssl_ca_certs``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from helpers import RedisClusterServer
from hurtle import BrokerError, Hurtle

pytest.importorskip("redis")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    cluster = RedisClusterServer(tmp_path_factory.mktemp("redis-cluster-tls"), tls=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_tasks_results_and_channels_run_over_tls(tls_cluster: RedisClusterServer) -> None:
    url = tls_cluster.url
    assert url.startswith("rediss+cluster://")
    app = Hurtle(url)
    done: list[int] = []

    @app.task(name="tls.add", store_result=True)
    def add(x: int, y: int) -> int:
        done.append(x)
        return x + y

    try:
        with app.channel("tls-feed").subscribe() as sub:
            handles = add.send_many([(i, 1) for i in range(300)])
            worker = app.worker(burst=True)
            worker.run()
            assert sorted(done) == list(range(300))
            assert handles[7].result(10) == 8
            other = Hurtle(url)  # another client
            try:
                assert other.handle(handles[299].id).result(10) == 300
            finally:
                other.close()
            app.channel("tls-feed", buffer=0).publish({"n": 1})
            deadline = time.monotonic() + 10
            got = None
            while got is None and time.monotonic() < deadline:
                got = sub.get(0.2)
            assert got is not None and got.data == {"n": 1}
    finally:
        app.close()


def test_a_plain_url_to_a_tls_cluster_fails_with_a_clear_error(
    tls_cluster: RedisClusterServer,
) -> None:
    plain = tls_cluster.url.split("?")[0].replace("rediss+cluster://", "redis+cluster://")
    started = time.monotonic()
    app = Hurtle(plain)
    try:
        with pytest.raises(BrokerError, match="Redis"):
            app.broker.stats(["default"])
    finally:
        app.close()
    assert time.monotonic() - started < 60  # an error, not a hang


def test_a_url_without_the_ca_is_refused_by_certificate_checks(
    tls_cluster: RedisClusterServer,
) -> None:
    # the server's certificate is signed by a CA the client was not told about
    app = Hurtle(tls_cluster.url.split("?")[0])
    try:
        with pytest.raises(BrokerError, match=r"(?i)certificate|ssl"):
            app.broker.stats(["default"])
    finally:
        app.close()


def test_channels_keep_redis_options_and_drop_the_brokers_own(redis_url: str) -> None:
    # wait_timeout is the broker's (for ?wait_replicas); socket_timeout is redis-py's
    app = Hurtle(redis_url + "?wait_timeout=2&socket_timeout=5")
    try:
        with app.channel("opts").subscribe() as sub:
            app.channel("opts", buffer=0).publish("hello")
            deadline = time.monotonic() + 10
            got = None
            while got is None and time.monotonic() < deadline:
                got = sub.get(0.2)
            assert got is not None and got.data == "hello"
    finally:
        app.close()
