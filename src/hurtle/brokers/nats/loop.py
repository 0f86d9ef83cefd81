"""One asyncio event loop per process, on a daemon thread of its own, for every NATS broker.

nats-py is asyncio; hurtle's broker API is synchronous. Every ``NatsBroker`` of a process (and
every consumer made from one) runs its coroutines on this one loop through ``run``: a blocked
``fetch`` waits on a future while the loop serves the other brokers' calls. A forked child
starts a loop of its own (the parent's thread does not exist in the child).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

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


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the process's loop and wait for its outcome from this thread."""
    target = loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("a NATS broker call was made from its own event-loop thread")
    return asyncio.run_coroutine_threadsafe(coro, target).result(timeout)


def spawn(coro: Coroutine[Any, Any, Any]) -> None:
    """Start ``coro`` on the loop without waiting for it."""
    asyncio.run_coroutine_threadsafe(coro, loop())
