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
