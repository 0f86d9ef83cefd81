"""``drain(app)``: run a real worker on the app's broker until its queues are idle.

The worker is the one ``hurtle worker --burst`` runs (``solo`` pool by default), on a thread of
its own so that a task that never returns cannot hang the caller: it stops once its queues have
nothing ready, delayed or in flight (a paused queue: nothing in flight), and ``drain`` returns
the ``Summary`` of what it ran. Past ``timeout`` the worker is asked to stop and ``DrainTimeout``
says what is left. Periodic tasks are not scheduled.

Delayed messages (a send's ``delay``/``eta``, a retry's backoff) are waited for, as a worker
would. On ``memory://``, ``fast_forward=True`` makes them due at once instead
(``MemoryBroker.fast_forward``, checked every few milliseconds while the worker runs); messages
a rate or concurrency limit throttled still wait their turn. Other brokers keep real time.

It works on every broker: ``memory://`` for unit tests, SQLite, Redis and the others with a
worker exactly like a deployed one (the same queues by default: the app's tasks' and
``default``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..brokers.memory import MemoryBroker
from ..errors import ConfigurationError, HurtleError
from .summary import Summary

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..brokers import Broker

#: Seconds a worker asked to stop at the timeout gets before ``drain`` raises all the same.
STOP_GRACE = 1.0
#: Longest wait between two fast-forwards of delayed messages (the first is a millisecond).
FAST_FORWARD_MAX_WAIT = 0.02


class DrainTimeout(HurtleError, TimeoutError):
    """``drain`` ran out of time with work left; ``summary`` is what ran until then."""

    def __init__(self, message: str, summary: Summary) -> None:
        super().__init__(message)
        self.summary = summary


def drain(
    app: Hurtle,
    queues: Sequence[str] | None = None,
    *,
    timeout: float = 10.0,
    fast_forward: bool = False,
    pool: str = "solo",
    concurrency: int = 1,
) -> Summary:
    """Run a worker on ``queues`` (default: the app's, as ``hurtle worker``) until they are idle;
    returns what it ran. Raises ``DrainTimeout`` after ``timeout`` seconds with work left."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (math.isfinite(timeout) and timeout > 0)
    ):
        raise ConfigurationError(f"drain: timeout must be a number of seconds > 0, got {timeout!r}")
    if isinstance(queues, str):
        raise ConfigurationError(
            f"drain: queues must be a list of queue names, got the str {queues!r}: "
            f"write queues=[{queues!r}]"
        )
    broker = app.broker
    memory = broker if isinstance(broker, MemoryBroker) else None
    if fast_forward and memory is None:
        raise ConfigurationError(
            f"drain: fast_forward=True works on memory:// only, and this app's broker is "
            f"{broker.url}: leave it out (delayed messages are then waited for) or test on "
            f"memory://"
        )
    worker = app.worker(
        queues=queues, pool=pool, concurrency=concurrency, burst=True, scheduler=False
    )
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as err:  # given to the caller
            raised.append(err)

    thread = threading.Thread(target=run, name="hurtle-drain", daemon=True)
    deadline = time.monotonic() + timeout
    thread.start()
    wait = 0.001
    while thread.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if not fast_forward or memory is None:
            thread.join(left)
        elif memory.fast_forward(worker.queues):
            wait = 0.001
        else:
            thread.join(min(left, wait))
            wait = min(wait * 2, FAST_FORWARD_MAX_WAIT)
    summary = Summary()
    if thread.is_alive():
        worker.stop()
        thread.join(STOP_GRACE)
        if worker.processor is not None:
            summary.add(worker.processor.tally.snapshot())
        raise DrainTimeout(_what_is_left(broker, worker.queues, timeout, thread), summary)
    if worker.processor is not None:
        summary.add(worker.processor.tally.snapshot())
    if raised:
        raise raised[0]
    return summary


def _what_is_left(
    broker: Broker, queues: Sequence[str], timeout: float, thread: threading.Thread
) -> str:
    """One line: the queues that are not idle, with their counts, and what to do."""
    try:
        stats = broker.stats(queues)
    except Exception as err:  # the broker went away: say so
        left = f"their counts cannot be read ({err})"
    else:
        busy = []
        now = time.time()
        for name, s in stats.items():
            if not (s.ready or s.delayed or s.in_flight):
                continue
            due = ""
            if s.delayed:
                try:
                    first = broker.next_delayed(name, 1)
                except Exception:
                    first = None
                if first:
                    due = f" (the next due in {max(first[0][0] - now, 0.0):.1f}s)"
            busy.append(
                f"{name}: {s.ready} ready, {s.delayed} delayed{due}, {s.in_flight} in flight"
                + (" (paused)" if s.paused else "")
            )
        left = "; ".join(busy) or "nothing left in them now"
    still = ""
    if thread.is_alive():
        still = "; a task is still running (it goes on, on the drain's thread)"
    return (
        f"drain: queues {', '.join(queues)} were not idle after {timeout:g}s: {left}{still}. "
        "Give drain a longer timeout=, or on memory:// fast_forward=True to run delayed "
        "messages at once"
    )
