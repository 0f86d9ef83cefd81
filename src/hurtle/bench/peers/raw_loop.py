"""What the raw loops (``raw_redis``, ``raw_nats``) share: the least a task message carries, a
msgpack map ``{"id": <16 hex digits>, "task": "add", "args": [5, 6]}`` (without an id nothing can
be acknowledged, retried or traced; without a name, no function can be chosen), the function it
names, and a consumer process that stays up once done. Needs neither redis nor nats."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec

from ..harness.probe import hit

BATCH = 1000
_encode = msgspec.msgpack.encode


def add(x: int, y: int) -> int:
    hit()
    return x + y


FUNCTIONS: dict[str, Callable[..., Any]] = {"add": add}


def message() -> bytes:
    """One encoded ``add(5, 6)`` message with a fresh id."""
    return _encode({"id": os.urandom(8).hex(), "task": "add", "args": [5, 6]})


def consumer_main(argv: list[str], consume: Callable[[int], int]) -> NoReturn:
    """``python -m <raw loop> consume COUNT``: consume, then stay up (``stay_up``)."""
    command, count = argv[0], int(argv[1])
    if command != "consume":
        raise SystemExit(f"unknown command {command!r}: use consume")
    consume(count)
    stay_up()


def stay_up() -> NoReturn:
    """Stay up, like a worker, until the driver stops this process (and reads its RSS)."""
    while True:
        time.sleep(3600)
