"""The app of ``hurtle bench features``: ``bench.add`` registered with the task options in
``$HURTLE_BENCH_OPTIONS`` (JSON), published with ``send_many`` in batches of ``BATCH`` (with
the per-call options of ``$HURTLE_BENCH_SEND``, if any). Calls have distinct arguments
(``add(i, 6)``), so that ``unique_for`` keeps every one of them.

``publish_nested`` (the ``nested`` row) sends the same number of calls as workflows of
``NESTED`` calls each: a chord inside a chain, ``chain(add(i, 6), chord([add(j) ...],
total()))``, every call but the first and the last a member of the chord; ``publish_chord``
(the ``chord`` row) as flat chords of as many."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from ...app import Hurtle
from ...context import current
from ...workflows import chain, chord
from ..harness.probe import hit

BATCH = 1000
#: Calls per workflow of the ``nested`` row.
NESTED = 100

app = Hurtle(heartbeat_timeout=10)


def add(x: int, y: int) -> int:
    hit()
    return x + y


def add_reporting(x: int, y: int) -> int:
    """``add`` that reports its progress (the ``progress`` row)."""
    hit()
    current().progress(0.5, "half way")
    return x + y


task = app.task(name="bench.add", **json.loads(os.environ.get("HURTLE_BENCH_OPTIONS", "{}")))(
    add_reporting if os.environ.get("HURTLE_BENCH_CALLS") == "progress" else add
)


#: Per-call options of the sends (``$HURTLE_BENCH_SEND``, JSON), such as a ``delay``.
SEND = json.loads(os.environ.get("HURTLE_BENCH_SEND") or "{}")


def publish(count: int, progress: Callable[[int], None]) -> int:
    sender = task.options(**SEND) if SEND else task
    sent = 0
    while sent < count:
        n = min(BATCH, count - sent)
        sender.send_many([(i, 6) for i in range(sent, sent + n)])
        sent += n
        progress(sent)
    app.close()
    return sent


@app.task(name="bench.total")
def total(xs: list[int]) -> int:
    """The ``nested`` row's chord callback: a call like the others, given their results."""
    hit()
    return sum(xs)


def publish_nested(count: int, progress: Callable[[int], None]) -> int:
    """``count`` calls as chords inside chains of ``NESTED`` calls each (fewer in the last)."""
    return _workflows(count, progress, nested=True)


def publish_chord(count: int, progress: Callable[[int], None]) -> int:
    """``count`` calls as flat chords of ``NESTED`` calls each, the callback one of them: what
    any workflow costs, beside which ``nested`` shows what nesting adds."""
    return _workflows(count, progress, nested=False)


def _workflows(count: int, progress: Callable[[int], None], nested: bool) -> int:
    sent = 0
    while sent < count:
        n = min(NESTED, count - sent)
        if n < 3:  # too few for the shape: plain calls
            task.send_many([(i, 6) for i in range(sent, sent + n)])
        elif nested:
            members = [task.s(i) for i in range(n - 2)]
            chain(task.s(sent, 6), chord(members, total.s())).send()
        else:
            chord([task.s(i, 6) for i in range(sent, sent + n - 1)], total.s()).send()
        sent += n
        if sent % BATCH < NESTED:
            progress(sent)
    progress(sent)
    app.close()
    return sent
