"""The NATS broker on a cluster of three ``nats-server -js`` (and on one alone): how many copies
of its streams and buckets it asks for (``replicas=``), URLs that list several servers, and
compare-and-set on a replicated bucket, which nats-server before 2.9.21 gets wrong."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import free_port
from hurtle.brokers import make_broker
from hurtle.brokers.nats import NatsBroker, names
from hurtle.brokers.nats.loop import run
from hurtle.brokers.nats.options import CAS_FIXED, version
from hurtle.brokers.nats.store import STATE_BUCKET
from hurtle.errors import BrokerError, ConfigurationError
from hurtle.message import Message
from nats_server import NatsCluster, NatsServer

pytest.importorskip("nats")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    c = NatsCluster(tmp_path_factory.mktemp("nats-cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def brokers() -> Iterator[list[NatsBroker]]:
    made: list[NatsBroker] = []
    yield made
    for b in made:
        b.close()


def _broker(url: str, made: list[NatsBroker]) -> NatsBroker:
    b = make_broker(url)
    assert isinstance(b, NatsBroker)
    made.append(b)
    return b


def _replicas(broker: NatsBroker, stream: str) -> int:
    async def ask() -> int:
        info = await broker.store.js.stream_info(stream)
        return int(info.config.num_replicas or 1)

    return run(ask())


def _publish_and_dead_letter(broker: NatsBroker, queue: str) -> None:
    broker.publish([Message(id=f"{queue}-1", task="t", queue=queue, args=())])
    run(broker.write_dead(queue, [(b"raw", "a reason")]))
    run(broker.store.kv())


def test_streams_and_buckets_have_three_copies_by_default_on_a_cluster_of_three(
    cluster: NatsCluster, brokers: list[NatsBroker]
) -> None:
    b = _broker(cluster.url, brokers)
    _publish_and_dead_letter(b, "r-default")
    assert _replicas(b, names.stream("r-default")) == 3
    assert _replicas(b, names.dead_stream("r-default")) == 3
    assert _replicas(b, f"KV_{STATE_BUCKET}") == 3


def test_replicas_in_the_url_sets_the_copies_of_new_streams(
    cluster: NatsCluster, brokers: list[NatsBroker]
) -> None:
    b = _broker(cluster.url + "?replicas=2", brokers)
    _publish_and_dead_letter(b, "r-two")
    assert _replicas(b, names.stream("r-two")) == 2
    assert _replicas(b, names.dead_stream("r-two")) == 2


def test_more_replicas_than_servers_is_one_broker_error_naming_the_option(
    cluster: NatsCluster, brokers: list[NatsBroker]
) -> None:
    b = _broker(cluster.url + "?replicas=5", brokers)
    with pytest.raises(BrokerError) as info:
        b.publish([Message(id="m", task="t", queue="r-five", args=())])
    assert "cannot keep 5 replicas" in str(info.value) and "replicas=" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_server_alone_keeps_one_copy_and_refuses_more_in_one_broker_error(
    nats_server: NatsServer, brokers: list[NatsBroker]
) -> None:
    nats_server.clear()
    b = _broker(nats_server.url, brokers)
    _publish_and_dead_letter(b, "r-alone")
    assert _replicas(b, names.stream("r-alone")) == 1
    three = _broker(nats_server.url + "?replicas=3", brokers)
    with pytest.raises(
        BrokerError, match=r"cannot keep 3 replicas.*not supported in non-clustered"
    ):
        three.publish([Message(id="m", task="t", queue="r-alone-3", args=())])


@pytest.mark.parametrize("value", ["0", "6", "two", ""])
def test_a_bad_replicas_value_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError, match=f"replicas={value!r}; it is a number"):
        make_broker(f"nats://127.0.0.1:{free_port()}?replicas={value}")


def test_an_unknown_option_is_a_configuration_error_listing_the_options() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option 'replica'.*replicas"):
        make_broker(f"nats://127.0.0.1:{free_port()}?replica=3")


def test_a_url_listing_a_dead_server_first_connects_to_a_live_one(
    nats_server: NatsServer, brokers: list[NatsBroker]
) -> None:
    nats_server.clear()
    b = _broker(f"nats://127.0.0.1:{free_port()},127.0.0.1:{nats_server.port}", brokers)
    b.publish([Message(id="m", task="t", queue="listed", args=())])
    assert b.stats(["listed"])["listed"].ready == 1


def test_a_url_of_servers_none_of_which_answers_is_one_broker_error() -> None:
    url = f"nats://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError, match=f"cannot connect to NATS at {url}: "):
        make_broker(url)


def _server_version(cluster: NatsCluster, made: list[NatsBroker]) -> tuple[int, ...]:
    return version(_broker(cluster.url, made).store.server_info)


def test_a_cluster_before_2_9_21_is_warned_of_when_the_broker_connects(
    cluster: NatsCluster, brokers: list[NatsBroker], caplog: pytest.LogCaptureFixture
) -> None:
    if _server_version(cluster, brokers) >= CAS_FIXED:
        pytest.skip("nats-server 2.9.21 or later: its compare-and-set holds")
    caplog.set_level(logging.WARNING, "hurtle.brokers.nats")
    caplog.clear()
    _broker(cluster.url, brokers)
    _broker(cluster.url + "?replicas=1", brokers)  # one copy: nothing to warn of
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2.9.21" in warnings[0] and "replicas=3" in warnings[0]


@pytest.mark.parametrize("replicas", [1, 3])
def test_concurrent_compare_and_set_on_a_bucket_lets_one_writer_win_each_time(
    cluster: NatsCluster, brokers: list[NatsBroker], request: pytest.FixtureRequest, replicas: int
) -> None:
    """Clients on each server add 1 to one key, each addition a compare-and-set on the
    revision read: the key counts every addition exactly when one writer wins each round."""
    if replicas > 1 and _server_version(cluster, brokers) < CAS_FIXED:
        request.applymarker(
            pytest.mark.xfail(
                reason="nats-server before 2.9.21 lets concurrent compare-and-sets on a "
                "replicated bucket all win (the broker warns of it at connect)",
                strict=False,
            )
        )
    clients = [
        _broker(f"nats://127.0.0.1:{server.port}?replicas={replicas}", brokers)
        for server in cluster.servers
        for _ in range(2)
    ]
    bucket = f"cas-{replicas}"
    each = 40

    async def add(b: NatsBroker) -> int:
        def plus_one(old: Any) -> tuple[Any, None]:
            return (old or 0) + 1, None

        for _ in range(each):
            await b.store.cas("count", plus_one, bucket)
        return each

    async def all_() -> list[int]:
        await clients[0].store.kv(bucket)  # made once, before the others look for it
        return list(await asyncio.gather(*(add(b) for b in clients)))

    added = sum(run(all_()))
    found = run(clients[0].store.get("count", bucket))
    assert found is not None
    assert found[0] == added


def test_the_cluster_fixture_has_three_servers_in_one_cluster(
    cluster: NatsCluster, brokers: list[NatsBroker]
) -> None:
    info = _broker(cluster.url, brokers).store.server_info
    assert info.get("cluster") == "hurtle-test"
    assert len(set(info.get("connect_urls") or ())) == 3
