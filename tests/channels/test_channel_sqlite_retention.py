"""SQLite channels drop old frames; a subscriber left behind counts what it never read."""

from __future__ import annotations

from pathlib import Path

import pytest

from hurtle import Hurtle
from hurtle.channels import sqlite as sqlite_channels


def test_frames_past_retention_are_pruned_and_counted_as_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'channels.db'}")
    ticks = app.channel("ticks", flush_interval=3600)
    try:
        with ticks.subscribe() as sub:
            ticks.publish("seen")
            ticks.flush()
            first = sub.get(10)
            assert first is not None and first.data == "seen"
            monkeypatch.setattr(sqlite_channels, "RETENTION", 0.0)
            monkeypatch.setattr(sqlite_channels, "_PRUNE_EVERY", 0.0)
            for burst in (["a", "b"], ["c"], ["last"]):
                ticks.publish_many(burst)  # each flush prunes every frame before it
                ticks.flush()
            msg = sub.get(10)
            assert msg is not None and msg.data == "last"
            assert sub.lost == 3
    finally:
        app.close()


def test_pruned_frames_of_a_publisher_that_fell_silent_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'channels.db'}"
    listener, publisher, other = Hurtle(url), Hurtle(url), Hurtle(url)
    try:
        with listener.subscribe("ticks", "other") as sub:
            ticks = publisher.channel("ticks", flush_interval=3600)
            ticks.publish("seen")
            ticks.flush()
            first = sub.get(10)
            assert first is not None and first.data == "seen"
            ticks.publish_many(["a", "b", "c"])  # the subscriber will be too late for these
            publisher.close()  # ...and this publisher sends nothing more
            monkeypatch.setattr(sqlite_channels, "RETENTION", 0.0)
            monkeypatch.setattr(sqlite_channels, "_PRUNE_EVERY", 0.0)
            news = other.channel("other", buffer=0)
            news.publish("prunes what came before")
            news.publish("and again")
            msg = sub.get(10)
            assert msg is not None and msg.data == "and again"  # the rest was pruned unread
            # "a", "b", "c", and the first of "other" (whose publisher it never heard from)
            assert sub.lost == 4
    finally:
        for app in (listener, publisher, other):
            app.close()
