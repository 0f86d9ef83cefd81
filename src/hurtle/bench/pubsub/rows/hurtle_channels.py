"""Rows ``hurtle-buffered`` (channels with their default buffer: 1,000 messages or 5 ms) and
``hurtle-buffer0`` (``buffer=0``: one frame per publish), on the benchmark's Redis."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..loop import Client, Counter, Setup, ready_and_wait


def _publisher(
    setup: Setup, buffer: int | None
) -> tuple[Callable[[int], None], Callable[[], None]]:
    from ....app import Hurtle

    app = Hurtle(setup.redis_url)
    channels = [app.channel(c, buffer=buffer) for c in setup.channels]
    payload = "x" * setup.payload_size
    publishes = [ch.publish for ch in channels]

    def publish(i: int) -> None:
        publishes[i](payload)

    return publish, app.close


def _subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    from ....app import Hurtle

    app = Hurtle(setup.redis_url)
    sub = app.subscribe(*setup.channels)
    count = Counter(ready_and_wait(ready, go, start), setup.duration)
    count.receive(sub.get, 0.2)
    sub.close()
    app.close()
    return count.report(sub.lost, sub.reconnects)


ROWS = [
    Client("hurtle-buffered", functools.partial(_publisher, buffer=None), _subscriber),
    Client("hurtle-buffer0", functools.partial(_publisher, buffer=0), _subscriber),
]
