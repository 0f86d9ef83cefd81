"""How durable a SQLite broker's commits are: ``?synchronous=`` in its URL, checked and applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from hurtle import Hurtle
from hurtle.brokers import make_broker
from hurtle.brokers.sqlite import SQLiteBroker
from hurtle.errors import ConfigurationError

# PRAGMA synchronous reads back as a number: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
LEVELS = {"normal": 1, "full": 2}


def synchronous_of(broker: SQLiteBroker) -> int:
    """The level the broker's own connection runs at, read back from SQLite."""
    with broker._read() as conn:
        level: int = conn.execute("PRAGMA synchronous").fetchone()[0]
    return level


def test_every_commit_is_flushed_to_disk_by_default(tmp_path: Path) -> None:
    broker = make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}")
    assert isinstance(broker, SQLiteBroker)
    assert synchronous_of(broker) == LEVELS["full"]
    broker.close()


@pytest.mark.parametrize("value", ["full", "normal", "NORMAL", "Full"])
def test_the_synchronous_option_of_the_url_reaches_the_connection(
    tmp_path: Path, value: str
) -> None:
    broker = make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}?synchronous={value}")
    assert isinstance(broker, SQLiteBroker)
    assert synchronous_of(broker) == LEVELS[value.lower()]
    assert broker.path == tmp_path / "hurtle.db"
    broker.close()


def test_an_app_with_the_option_in_its_broker_url_gets_it(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}?synchronous=normal")
    assert isinstance(app.broker, SQLiteBroker)
    assert synchronous_of(app.broker) == LEVELS["normal"]
    app.close()


@pytest.mark.parametrize("value", ["off", "extra", "2", "fast", ""])
def test_a_synchronous_level_not_offered_is_refused_naming_it_and_the_choices(
    tmp_path: Path, value: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}?synchronous={value}")
    text = str(info.value)
    assert f"synchronous={value!r}" in text and "full, normal" in text
    assert not (tmp_path / "hurtle.db").exists()


def test_an_unknown_url_option_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option 'journal'.*synchronous"):
        make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}?journal=off")
