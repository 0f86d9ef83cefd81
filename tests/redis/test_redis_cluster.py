"""What only a Redis Cluster has: slots on several masters, and masters that fail over.

The conformance suite and the crash tests run on a cluster too (``redis-cluster`` in their
parameters); these tests cover the rest.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import Project, RedisClusterServer
from hurtle import Hurtle
from hurtle.brokers import StoredResult, make_broker
from hurtle.brokers.keys import RESULTS_CHANNEL, queue_keys
from hurtle.brokers.redis import RedisClusterConsumer
from hurtle.errors import BrokerError, ConfigurationError
from hurtle.message import message_id
from test_cli import TASKS

pytest.importorskip("redis")


def _blocked_on(port: int) -> list[str]:
    """The clients blocked in a ``BLPOP`` on the node at ``port`` (``CLIENT LIST``)."""
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "client", "list"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    # ``cmd`` is a client's last command; the flag ``b`` says it is blocked in it now
    return [
        line
        for line in out.splitlines()
        if "cmd=blpop" in line and "b" in line.split(" flags=")[1].split()[0]
    ]


def _shard_subscribers(port: int, channel: str) -> int:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "pubsub", "shardnumsub", channel],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout.split()
    return int(out[1])


def _queues_on_every_master(cluster: RedisClusterServer) -> list[str]:
    """Three queue names whose keys live on three different masters."""
    by_master: dict[int, str] = {}
    for i in range(200):
        name = f"q{i}"
        by_master.setdefault(cluster.master_of(queue_keys(name).wake), name)
        if len(by_master) == 3:
            return list(by_master.values())
    raise AssertionError("no three queues on three masters")


def test_a_consumer_of_queues_on_several_masters_waits_on_each_while_idle_only(
    redis_cluster: RedisClusterServer, redis_cluster_url: str
) -> None:
    queues = _queues_on_every_master(redis_cluster)
    broker = make_broker(redis_cluster_url)
    consumer = broker.consumer(queues)
    got: list[bytes] = []
    fetching = threading.Thread(target=lambda: got.extend(d.raw for d in consumer.fetch(1, 60)))
    fetching.start()
    try:
        masters = {redis_cluster.master_of(queue_keys(q).wake) for q in queues}
        deadline = time.monotonic() + 30
        # one BLPOP waits on each queue's master (one command cannot span slots)
        while not all(_blocked_on(port) for port in masters):
            assert time.monotonic() < deadline, "the consumer never blocked on every master"
            time.sleep(0.05)
        broker.publish_raw(queues[2], [b"last queue"])
        fetching.join(60)
        assert not fetching.is_alive()
        assert got == [b"last queue"]
        # awake, it waits on no queue: a busy consumer must not take tokens meant for idle ones
        assert isinstance(consumer, RedisClusterConsumer)
        assert not consumer._sent  # no BLPOP of its is outstanding
        for port in masters:
            deadline = time.monotonic() + 10
            while _blocked_on(port):
                assert time.monotonic() < deadline, "a wait outlived the consumer's idleness"
                time.sleep(0.05)
        # idle again: it waits on every queue again
        fetching = threading.Thread(target=lambda: got.extend(d.raw for d in consumer.fetch(1, 60)))
        fetching.start()
        deadline = time.monotonic() + 30
        while not all(_blocked_on(port) for port in masters):
            assert time.monotonic() < deadline, "the consumer never blocked on every master"
            time.sleep(0.05)
        broker.publish_raw(queues[0], [b"first queue"])
        fetching.join(60)
        assert not fetching.is_alive()
        assert got == [b"last queue", b"first queue"]
    finally:
        consumer.close()
        broker.close()


def _getkeys_calls(cluster: RedisClusterServer) -> int:
    """``COMMAND GETKEYS`` calls so far, on every node (``INFO commandstats``)."""
    total = 0
    for port in cluster.procs:
        out = subprocess.run(
            cluster.cli("-p", str(port), "info", "commandstats"),
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        for line in out.splitlines():
            if line.startswith("cmdstat_command|getkeys:"):
                total += int(line.split("calls=")[1].split(",")[0])
    return total


def test_scripts_in_a_pipeline_go_to_the_master_of_their_keys_and_nowhere_else(
    make_redis_cluster: type[RedisClusterServer], tmp_path: Path
) -> None:
    # A script's keys are in its arguments: asking a node which keys they are (COMMAND
    # GETKEYS, with the whole batch of messages) would send every batch to that node too.
    cluster = make_redis_cluster()
    queues = _queues_on_every_master(cluster)
    project = Project(tmp_path, TASKS, ("tasks.add",), cluster.url)
    try:
        add = project.app.tasks["tasks.add"]
        add.options(queue=queues[0]).send_many([(1, 2)])  # connected: the client's map learnt
        before = _getkeys_calls(cluster)
        for q in queues:
            add.options(queue=q).send_many([(i, i) for i in range(100)])
        consumer = project.app.broker.consumer(queues)
        taken = consumer.fetch(1000, 1)
        consumer.ack(taken, [StoredResult(message_id(taken[0].raw), b"1", 60.0)])
        consumer.close()
        assert taken
        assert _getkeys_calls(cluster) == before
    finally:
        project.app.close()


def test_a_cluster_url_with_a_database_is_refused(redis_cluster: RedisClusterServer) -> None:
    with pytest.raises(ConfigurationError, match="only database 0"):
        make_broker(redis_cluster.url + "/3")


def test_bad_wait_options_are_refused(redis_cluster: RedisClusterServer) -> None:
    with pytest.raises(ConfigurationError, match="wait_replicas"):
        make_broker(redis_cluster.url + "?wait_replicas=some")
    with pytest.raises(ConfigurationError, match="wait_timeout"):
        make_broker(redis_cluster.url + "?wait_replicas=1&wait_timeout=0")


def test_wait_replicas_publishes_once_replicas_have_the_messages(
    redis_cluster: RedisClusterServer, redis_cluster_url: str
) -> None:
    queues = _queues_on_every_master(redis_cluster)
    broker = make_broker(redis_cluster_url + "?wait_replicas=1")
    try:
        for q in queues:
            broker.publish_raw(q, [b"a", b"b"])
        assert {q: s.ready for q, s in broker.stats(queues).items()} == dict.fromkeys(queues, 2)
    finally:
        broker.close()


def test_wait_replicas_raises_when_too_few_replicas_acknowledge(
    redis_cluster: RedisClusterServer, redis_cluster_url: str
) -> None:
    # each master has one replica: two can never acknowledge
    broker = make_broker(redis_cluster_url + "?wait_replicas=2&wait_timeout=0.05")
    try:
        with pytest.raises(BrokerError, match="only 1 of the 2 replicas"):
            broker.publish_raw("q", [b"a"])
    finally:
        broker.close()


def test_wait_replicas_on_one_server_without_replicas_raises(redis_url: str) -> None:
    broker = make_broker(redis_url + "?wait_replicas=1&wait_timeout=0.05")
    try:
        with pytest.raises(BrokerError, match="only 0 of the 1 replicas"):
            broker.publish_raw("q", [b"a"])
    finally:
        broker.close()


def test_consumption_goes_on_when_a_master_is_killed_and_its_replica_promoted(
    make_redis_cluster: type[RedisClusterServer], tmp_path: Path
) -> None:
    cluster = make_redis_cluster()
    total = 3000
    # published with WAIT: every message is on the replica before the master dies
    project = Project(
        tmp_path, TASKS, ("tasks.slow",), cluster.url + "?wait_replicas=1&wait_timeout=5"
    )
    try:
        project.send_many("tasks.slow", [(i, 0.001) for i in range(total)])
        worker = project.popen("worker", "tasks:app", HURTLE_HEARTBEAT_TIMEOUT="5")
        project.wait_for(lambda: len(project.lines("done")) >= 300, timeout=60)
        master = cluster.master_of(queue_keys("default").wake)
        cluster.kill(master)  # SIGKILL, while the worker consumes
        at_kill = len(project.lines("done"))
        assert at_kill < total  # still consuming when the master died
        project.wait_for(lambda: len(set(project.lines("done"))) == total, timeout=120)
        assert cluster.master_of(queue_keys("default").wake) != master  # a replica took over
        worker.terminate()
        assert project.stop(worker) == 0, project.output(worker)
    finally:
        project.app.close()
    done = collections.Counter(project.lines("done"))
    assert set(done) == {str(i) for i in range(total)}  # nothing published was lost


def test_a_publish_its_replica_never_got_is_lost_in_a_failover_and_wait_replicas_says_so(
    make_redis_cluster: type[RedisClusterServer],
) -> None:
    # The window that ?wait_replicas closes, held open: the queue's replica is stopped and cut
    # off from its master, a publish is acknowledged by the master alone, the master dies and
    # the replica (resumed) is promoted without it. A publish with WAIT in the same window
    # raises instead of returning.
    cluster = make_redis_cluster()
    queue = "default"
    master = cluster.master_of(queue_keys(queue).wake)
    replica = int(cluster.replication(master)["slave0"].split("port=")[1].split(",")[0])
    plain = make_broker(cluster.url)
    waiting = make_broker(cluster.url + "?wait_replicas=1&wait_timeout=0.2")
    try:
        with make_broker(cluster.url + "?wait_replicas=1&wait_timeout=30") as patient:
            patient.publish_raw(queue, [b"replicated"])  # on the replica, however loaded
        cluster.procs[replica].send_signal(signal.SIGSTOP)
        try:
            subprocess.run(
                cluster.cli("-p", str(master), "client", "kill", "type", "replica"),
                check=True,
                capture_output=True,
                timeout=10,
            )
            plain.publish_raw(queue, [b"acknowledged by the master alone"])  # returns
            with pytest.raises(BrokerError, match="only 0 of the 1 replicas"):
                waiting.publish_raw(queue, [b"waited"])
            cluster.kill(master)
        finally:
            cluster.procs[replica].send_signal(signal.SIGCONT)
        cluster.wait_ok(60)
        assert cluster.master_of(queue_keys(queue).wake) == replica
        promoted = make_broker(cluster.url)
        try:
            consumer = promoted.consumer([queue])
            got = [d.raw for d in consumer.fetch(10, 1)]
            consumer.close()
        finally:
            promoted.close()
    finally:
        plain.close()
        waiting.close()
    # the publish that returned without WAIT is gone; the one with WAIT raised (it had been
    # stored on the master, and went with it)
    assert got == [b"replicated"]


def test_result_waiters_hear_announcements_after_the_channels_master_fails_over(
    make_redis_cluster: type[RedisClusterServer],
) -> None:
    cluster = make_redis_cluster()
    waiter, worker = make_broker(cluster.url), make_broker(cluster.url)
    woken = threading.Event()
    stop = waiter.watch_results(["m1"], woken.set)
    assert stop is not None
    consumer = worker.consumer(["q"])

    def store_until_woken() -> None:
        deadline = time.monotonic() + 60
        while not woken.wait(0.1):
            assert time.monotonic() < deadline, "the watcher was never woken"
            with contextlib.suppress(BrokerError):  # the cluster may be failing over
                consumer.ack((), [StoredResult("m1", b"done", 60.0)])

    try:
        store_until_woken()
        master = cluster.master_of(RESULTS_CHANNEL)
        cluster.kill(master)
        cluster.wait_ok(60)
        promoted = cluster.master_of(RESULTS_CHANNEL)
        assert promoted != master
        # the listener lost its shard: it subscribes again, on the promoted replica ...
        deadline = time.monotonic() + 60
        while _shard_subscribers(promoted, RESULTS_CHANNEL) == 0:
            assert time.monotonic() < deadline, "the listener never subscribed again"
            time.sleep(0.1)
        woken.clear()
        # ... and hears announcements there
        store_until_woken()
        assert waiter.get_result("m1") == b"done"
    finally:
        stop()
        consumer.close()
        waiter.close()
        worker.close()


def test_a_channel_feed_goes_on_after_its_master_fails_over(
    make_redis_cluster: type[RedisClusterServer],
) -> None:
    # Pub/sub is at most once: what is published while the master is down or its replica not
    # yet promoted may be lost (the subscriber counts it). What arrives comes in order, once,
    # and the feed resumes on the promoted replica without the subscriber doing anything.
    cluster = make_redis_cluster()
    publisher_app, subscriber_app = Hurtle(cluster.url), Hurtle(cluster.url)
    feed = publisher_app.channel("ticks", buffer=0)
    stop = threading.Event()
    sent: list[int] = []

    def publish() -> None:
        n = 0
        while not stop.is_set():
            with contextlib.suppress(BrokerError):  # the master may be down
                feed.publish(n)
                sent.append(n)
            n += 1
            time.sleep(0.005)

    got: list[int] = []
    try:
        with subscriber_app.channel("ticks").subscribe() as sub:
            thread = threading.Thread(target=publish, daemon=True)
            thread.start()

            def receive_until(condition: Callable[[], bool], seconds: float) -> None:
                deadline = time.monotonic() + seconds
                while not condition():
                    assert time.monotonic() < deadline, f"received {len(got)}, last {got[-1:]}"
                    msg = sub.get(0.2)
                    if msg is not None:
                        got.append(msg.data)

            receive_until(lambda: len(got) >= 100, 30)
            master = cluster.master_of("hurtle:ch:0:ticks")
            cluster.kill(master)  # SIGKILL
            killed_at = max(sent)
            cluster.wait_ok(60)
            assert cluster.master_of("hurtle:ch:0:ticks") != master
            # the feed resumes: a steady stream of what was published after the kill
            receive_until(lambda: sum(n > killed_at for n in got) >= 100, 90)
            lost = sub.lost
        stop.set()
        thread.join(10)
    finally:
        stop.set()
        publisher_app.close()
        subscriber_app.close()
    assert got == sorted(set(got)), "out of order or twice"
    missing = len(set(range(got[0], got[-1] + 1)) - set(got))
    print(f"channel failover: {len(got)} received, {missing} missing in between, lost={lost}")
