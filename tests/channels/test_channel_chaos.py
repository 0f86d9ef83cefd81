"""Chaos for channels: subscribers cut off at random moments while publishers come and go, and
for every subscriber, on every channel, received + lost == published, exactly.

A cut is ``CLIENT KILL TYPE pubsub`` on Redis (on every node of a Redis Cluster), standing in for
Redis cutting off a slow reader; on PostgreSQL, ``pg_terminate_backend`` of the feeds' ``LISTEN``
connections; on SQLite, a subscriber that stops reading for longer than the
retention (shortened to 50 ms here) while frames are pruned. Publishers are apps of their own,
each a new publisher id, created and closed at random moments, with random buffers, flush
intervals and bursts; some bursts are flushed at once, others left to the flusher.

Settings (environment), as the other chaos tests: ``HURTLE_CHAOS_TRIALS`` — trials per backend
(default 2); ``HURTLE_CHAOS_SEED`` — the base seed (default: drawn at random, printed with each
trial; a failure shows it, and ``HURTLE_CHAOS_SEED=<base>`` replays the same choices);
``HURTLE_CHAOS_REPORT`` — a file to which each trial's figures are appended as a JSON line
(published, received and counted lost over all subscribers, and what was neither: *missing*, or
received beyond what was published: *excess*).
"""

from __future__ import annotations

import collections
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hurtle import Hurtle
from hurtle.channels import Channel, Subscription
from hurtle.channels import sqlite as sqlite_channels

TRIALS = int(os.environ.get("HURTLE_CHAOS_TRIALS") or 2)
SEED = int(os.environ.get("HURTLE_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
REPORT = os.environ.get("HURTLE_CHAOS_REPORT")
CHANNELS = ("chaos.a", "chaos.b", "chaos.c")
SUBSCRIBERS = 3
#: Every wait of a trial ends by this deadline (seconds), whatever happens.
DEADLINE = 60.0


@pytest.fixture(params=["sqlite", "redis", "redis-cluster", "postgres"])
def chaos_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'channels.db'}"
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    return str(request.getfixturevalue("redis_url"))


@dataclass
class Reader:
    """One subscriber, read by a thread of its own, that stops reading while ``paused``."""

    sub: Subscription
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    lost: collections.Counter[str] = field(default_factory=collections.Counter)
    paused_until: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            if time.monotonic() < self.paused_until:
                time.sleep(0.005)
                continue
            msg = self.sub.get(0.05)
            if msg is not None:
                self.received[msg.channel] += 1

    def accounted(self) -> int:
        return sum(self.received.values()) + self.sub.lost


def cut(url: str, readers: list[Reader], rng: random.Random) -> str:
    if url.startswith("sqlite"):
        reader = rng.choice(readers)
        reader.paused_until = time.monotonic() + rng.uniform(0.1, 0.3)
        return "pause"
    if url.startswith("postgres"):
        from test_channel_postgres import _terminate_listeners

        _terminate_listeners(url)
        return "kill"
    from test_channel_redis_loss import kill_pubsub_clients

    kill_pubsub_clients(url)
    return "kill"


@pytest.mark.timeout(360)  # PostgreSQL: a transaction per flush, up to 3,000 in a burst
@pytest.mark.parametrize("trial", range(TRIALS))
def test_every_message_is_received_or_counted_lost_whatever_is_cut(
    chaos_url: str, trial: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = SEED + trial
    print(f"channel chaos seed {seed}: replay with HURTLE_CHAOS_SEED={SEED}")
    rng = random.Random(seed)
    monkeypatch.setattr(sqlite_channels, "RETENTION", 0.05)
    monkeypatch.setattr(sqlite_channels, "_PRUNE_EVERY", 0.01)
    listener = Hurtle(chaos_url)
    publishers: list[tuple[Hurtle, dict[str, Channel]]] = []
    published: collections.Counter[str] = collections.Counter()
    actions: collections.Counter[str] = collections.Counter()
    readers: list[Reader] = []
    threads: list[threading.Thread] = []

    def new_publisher() -> None:
        app = Hurtle(chaos_url)
        buffer = rng.choice([0, 7, 100, 1000])
        interval = rng.choice([0.001, 0.005, 0.05])
        channels = {n: app.channel(n, buffer=buffer, flush_interval=interval) for n in CHANNELS}
        publishers.append((app, channels))
        actions["publisher"] += 1

    def burst(channels: dict[str, Channel]) -> None:
        name = rng.choice(CHANNELS)
        n = rng.choice([1, rng.randint(2, 50), rng.randint(50, 3000)])
        if rng.random() < 0.5:
            channels[name].publish_many(range(n))
        else:
            for i in range(n):
                channels[name].publish(i)
        if rng.random() < 0.5:
            channels[name].flush()
        published[name] += n
        actions["burst"] += 1

    try:
        for _ in range(SUBSCRIBERS):
            reader = Reader(listener.subscribe(*CHANNELS))
            reader.sub.on_loss = lambda channel, n, r=reader: r.lost.update({channel: n})
            readers.append(reader)
            threads.append(threading.Thread(target=reader.run, daemon=True))
            threads[-1].start()
        new_publisher()
        for _ in range(rng.randint(40, 80)):
            roll = rng.random()
            if roll < 0.1:
                new_publisher()
            elif roll < 0.15 and len(publishers) > 1:
                app, _ = publishers.pop(rng.randrange(len(publishers)))
                app.close()  # flushes what it buffered
                actions["retired"] += 1
            elif roll < 0.3:
                actions[cut(chaos_url, readers, rng)] += 1
                if rng.random() < 0.5:  # a publisher appears while the subscribers are away
                    new_publisher()
                    burst(publishers[-1][1])
            else:
                burst(rng.choice(publishers)[1])
            time.sleep(rng.uniform(0, 0.02))
        for app, _ in publishers:
            app.close()
        publishers.clear()
        total = sum(published.values())
        deadline = time.monotonic() + DEADLINE
        while any(r.accounted() < total for r in readers) and time.monotonic() < deadline:
            time.sleep(0.05)
        for reader in readers:
            reader.stop.set()
        for thread in threads:
            thread.join(10)
        figures = [(sum(r.received.values()), r.sub.lost, r.sub.reconnects) for r in readers]
        print(f"published {total} ({dict(actions)}); (received, lost, reconnects): {figures}")
        report(chaos_url, total, readers, published)
        for reader in readers:
            assert reader.accounted() == total, f"seed {seed}: {dict(published)}"
            for name in CHANNELS:
                assert reader.received[name] + reader.lost[name] == published[name]
    finally:
        for reader in readers:
            reader.stop.set()
            reader.sub.close()
        for app, _ in publishers:
            app.close()
        listener.close()


def report(
    url: str, total: int, readers: list[Reader], published: collections.Counter[str]
) -> None:
    """Append the trial's figures to ``HURTLE_CHAOS_REPORT``, if set."""
    if not REPORT:
        return
    backend = url.split(":", 1)[0]  # sqlite, redis, redis+cluster, postgresql
    gaps = [
        published[name] - reader.received[name] - reader.lost[name]
        for reader in readers
        for name in CHANNELS
    ]
    line = {
        "broker": backend,
        "scenario": "channels: subscribers cut, publishers appearing",
        "subscribers": len(readers),
        "published": total,
        "received": sum(sum(r.received.values()) for r in readers),
        "lost": sum(r.sub.lost for r in readers),
        "missing": sum(g for g in gaps if g > 0),
        "excess": -sum(g for g in gaps if g < 0),
        "reconnects": sum(r.sub.reconnects for r in readers),
    }
    with open(REPORT, "a") as f:
        f.write(json.dumps(line) + "\n")
