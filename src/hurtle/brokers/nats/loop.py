"""One asyncio event loop per process, on a daemon thread of its own, for every NATS broker.

nats-py is asyncio; hurtle's broker API is synchronous. Every ``NatsBroker`` of a process (and
every consumer made from one) runs its coroutines on this one loop through ``run``: a blocked
``fetch`` waits on a future while the loop serves the other brokers' calls. A forked child
starts a loop of its own (the parent's thread does not exist in the child). What nats-py
raises comes out of ``run`` as a ``BrokerError`` (``connection.py``), as on every broker.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats.errors
import nats.js.errors

from .connection import UNREACHABLE, broker_error

T = TypeVar("T")

#: What ``run`` turns into a ``BrokerError``: whatever nats-py raises.
_NATS_ERRORS: tuple[type[BaseException], ...] = (
    *UNREACHABLE,
    nats.errors.Error,
    nats.js.errors.Error,
)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid = 0


def loop() -> asyncio.AbstractEventLoop:
    """The process's loop, started on first use."""
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or _thread is None or not _thread.is_alive():
            new = asyncio.new_event_loop()
            started = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.run_forever()

            _thread = threading.Thread(target=main, name="hurtle-nats-loop", daemon=True)
            _thread.start()
            started.wait()
            _loop, _pid = new, os.getpid()
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None, url: str = "") -> T:
    """Run ``coro`` on the process's loop and wait for its outcome from this thread.

    What nats-py raises comes out as a ``BrokerError`` (``connection.broker_error``; ``url``
    names the server in its message); anything else as it was raised."""
    target = loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("a NATS broker call was made from its own event-loop thread")
    future = asyncio.run_coroutine_threadsafe(coro, target)
    try:
        return future.result(timeout)
    except _NATS_ERRORS as err:  # (TimeoutError too: the call's, or the wait's)
        cause: BaseException = err
        if not future.done():
            future.cancel()
            cause = TimeoutError(f"no answer within {timeout}s")
        error = broker_error(cause, url)
        raise error from error.__cause__


def spawn(coro: Coroutine[Any, Any, Any]) -> None:
    """Start ``coro`` on the loop without waiting for it."""
    asyncio.run_coroutine_threadsafe(coro, loop())
