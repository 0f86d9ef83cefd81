"""The two processes of a ``hurtle bench pubsub`` row and what they share: a publisher sends
payloads to channels picked at random until the clock says stop; a subscriber listens to every
channel and counts what arrives, per second of the measured window and in total. Both report a
``dict`` on the result queue. How each talks to its system is the row's (``Client``, declared in
``pubsub/rows/``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import shutil
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

#: Messages sent between two looks at the clock.
CHECK_EVERY = 512
#: A subscriber stops once nothing arrived for this long after the publishers stopped (hurtle's
#: tail frames come 1 s after the last frame)...
_IDLE_AFTER_STOP = 1.5
#: ...or this long after they stopped, whichever comes first: what is still queued for it by
#: then counts as not delivered.
_DRAIN_MAX = 60.0


@dataclasses.dataclass(frozen=True)
class Setup:
    system: str
    redis_url: str
    channels: tuple[str, ...]
    payload_size: int
    duration: float
    zmq_in: str = ""
    zmq_out: str = ""
    nats_url: str = ""


#: In the publisher process: ``(publish(channel index), finish())`` for a ``Setup``.
Publisher = Callable[[Setup], tuple[Callable[[int], None], Callable[[], None]]]
#: In the subscriber process: ``(setup, ready, go, start)`` to its report (``Counter.report``).
Subscriber = Callable[[Setup, Any, Any, Any], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Client:
    """One row of ``hurtle bench pubsub``: its publisher and subscriber, what it needs, and the
    broker it brings along (started around the row; yields ``Setup`` fields such as
    ``nats_url``)."""

    name: str
    publisher: Publisher
    subscriber: Subscriber
    #: Modules it needs, each with the name it is installed by: ``{"zmq": "pyzmq"}``.
    modules: Mapping[str, str] = dataclasses.field(default_factory=dict)
    programs: tuple[str, ...] = ()
    broker: Callable[[], AbstractContextManager[dict[str, Any]]] | None = None

    def missing(self) -> str:
        """Why this row cannot run here, or ``""``."""
        for module, label in self.modules.items():
            if importlib.util.find_spec(module) is None:
                return f"{label} is not installed: pip install -e '.[bench]'"
        for program in self.programs:
            if shutil.which(program) is None:
                return f"{program} is not on PATH"
        return ""


class Counter:
    """Counts messages into one-second buckets of the measured window."""

    def __init__(self, start: float, duration: float) -> None:
        self.start = start
        self.stop = start + duration
        self.buckets = [0] * max(int(duration), 1)
        self.total = 0
        self.last_seen = time.time()

    def add(self, n: int) -> None:
        now = time.time()
        self.total += n
        self.last_seen = now
        i = int(now - self.start)
        if 0 <= i < len(self.buckets):
            self.buckets[i] += n

    def done(self) -> bool:
        now = time.time()
        return now > self.stop and (
            now - self.last_seen > _IDLE_AFTER_STOP or now > self.stop + _DRAIN_MAX
        )

    def receive(self, get: Callable[[float], object | None], timeout: float) -> None:
        """Call ``get(timeout)`` (a message, or ``None`` when none came) until ``done()``;
        messages are added 64 at a time, so that the clock is read once per 64."""
        n = 0
        while not self.done():
            if get(timeout) is None:
                continue
            n += 1
            if n == 64:
                self.add(64)
                n = 0
        self.add(n)

    def report(self, lost: int | None = None, reconnects: int = 0, **extra: Any) -> dict[str, Any]:
        """A subscriber's report: received, per second, lost (``None``: cannot tell)."""
        return {
            "received": self.total,
            "per_second": self.buckets,
            "lost": lost,
            "reconnects": reconnects,
            **extra,
        }


def ready_and_wait(ready: Any, go: Any, start: Any) -> float:
    """Say this process is ready, wait for the go, and return when the measured window opens."""
    ready.put("ready")
    go.wait()
    return float(start.value)


def _choices(n_channels: int) -> list[int]:
    rng = random.Random()
    return [rng.randrange(n_channels) for _ in range(8191)]


def run_publisher(
    make: Publisher, setup: Setup, ready: Any, go: Any, start: Any, results: Any
) -> None:
    """A publisher process: publish as fast as it can from the start until the end."""
    publish, finish = make(setup)
    picks = _choices(len(setup.channels))
    at = ready_and_wait(ready, go, start)
    while time.time() < at:
        time.sleep(0.001)
    stop = at + setup.duration
    sent = 0
    n_picks = len(picks)
    while True:
        for _ in range(CHECK_EVERY):
            publish(picks[sent % n_picks])
            sent += 1
        if time.time() >= stop:
            break
    error = ""
    try:
        finish()
    except Exception as err:  # reported in the row's notes; what was sent still counts
        error = f"{type(err).__name__}: {err}"
    results.put({"role": "publisher", "sent": sent, "error": error})


def run_subscriber(
    subscribe: Subscriber, setup: Setup, ready: Any, go: Any, start: Any, results: Any
) -> None:
    """A subscriber process: count until the publishers stopped and the tail arrived."""
    results.put({"role": "subscriber"} | subscribe(setup, ready, go, start))
