"""Loss that no publisher's numbers can show: a subscriber counts gaps in each channel's count,
kept by the backend, whoever published the messages it missed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hurtle import Hurtle
from hurtle.channels import memory as memory_channels
from hurtle.channels import sqlite as sqlite_channels


def test_a_subscriber_behind_the_retention_counts_what_publishers_it_never_heard_from_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'channels.db'}"
    listener = Hurtle(url)
    publishers = [Hurtle(url) for _ in range(4)]
    losses: list[tuple[str, int]] = []
    try:
        publishers[0].channel("ticks", buffer=0).publish("before")  # not the subscriber's
        with listener.subscribe(
            "ticks", "quiet", on_loss=lambda c, n: losses.append((c, n))
        ) as sub:
            # the subscriber reads nothing while three publishers it never heard from publish
            for i, app in enumerate(publishers[1:], 1):
                ch = app.channel("ticks", flush_interval=3600)
                ch.publish_many(range(10 * i))
                ch.flush()
            quiet = publishers[1].channel("quiet", flush_interval=3600)
            quiet.publish_many(range(12))  # ...and a channel that falls silent after these
            quiet.flush()
            # every frame older than the next flush is pruned before the subscriber reads it
            monkeypatch.setattr(sqlite_channels, "RETENTION", 0.0)
            monkeypatch.setattr(sqlite_channels, "_PRUNE_EVERY", 0.0)
            last = publishers[0].channel("ticks", flush_interval=3600)
            last.publish_many(range(31))
            last.flush()
            received = []
            deadline = time.monotonic() + 10
            while len(received) < 31 and time.monotonic() < deadline:
                if (msg := sub.get(0.2)) is not None:
                    received.append(msg.data)
        assert received == list(range(31))
        assert sub.lost == 10 + 20 + 30 + 12
        assert sorted(losses) == [("quiet", 12), ("ticks", 60)]
    finally:
        for app in (listener, *publishers):
            app.close()


def test_a_full_memory_feed_counts_what_it_dropped_though_nothing_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory_channels, "MAX_PENDING", 2)
    app = Hurtle("memory://")
    try:
        with app.subscribe("full") as sub:
            ch = app.channel("full", flush_interval=3600)
            for i in range(5):  # the last three find the feed full
                ch.publish(i)
                # sent without the flusher, so no tail frame follows them
                app._channels.backend.publish(ch.take())
            received = []
            deadline = time.monotonic() + 10
            while len(received) + sub.lost < 5 and time.monotonic() < deadline:
                if (msg := sub.get(0.2)) is not None:
                    received.append(msg.data)
        assert received == [0, 1]
        assert sub.lost == 3
    finally:
        app.close()
