"""pytest fixtures for code that uses hurtle.

Enable them in a ``conftest.py`` (hurtle registers no plugin by itself)::

    pytest_plugins = ["hurtle.testing.pytest_plugin"]

* ``hurtle_app_factory``: ``make(broker="memory://", **settings)`` makes apps, closed after the
  test; each ``memory://`` app has a store of its own;
* ``hurtle_memory_app``: one such app on ``memory://``;
* ``hurtle_eager``: ``hurtle_eager(app, propagate=False)`` puts an app (your project's own) in
  eager mode until the test ends, and returns the ``Summary`` of what runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..app import Hurtle
from ..brokers import Broker
from .eager import eager
from .summary import Summary


@pytest.fixture
def hurtle_app_factory() -> Iterator[Callable[..., Hurtle]]:
    """Makes apps (``memory://`` unless told otherwise) and closes them after the test."""
    made: list[Hurtle] = []

    def make(broker: str | Broker = "memory://", **settings: Any) -> Hurtle:
        app = Hurtle(broker, **settings)
        made.append(app)
        return app

    yield make
    for app in reversed(made):
        app.close()


@pytest.fixture
def hurtle_memory_app(hurtle_app_factory: Callable[..., Hurtle]) -> Hurtle:
    """A fresh app on a ``memory://`` store of its own, closed after the test."""
    return hurtle_app_factory("memory://")


@pytest.fixture
def hurtle_eager() -> Iterator[Callable[..., Summary]]:
    """``hurtle_eager(app)``: eager mode for ``app`` until the end of the test."""
    with contextlib.ExitStack() as stack:

        def start(app: Hurtle, *, propagate: bool = False) -> Summary:
            return stack.enter_context(eager(app, propagate=propagate))

        yield start
