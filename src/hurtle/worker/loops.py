"""``Loops``: the event loops that run ``async def`` tasks outside the asyncio pool.

In the solo and threads pools each thread has a loop of its own, made on first use, and runs a
task's coroutine to its end on it. Greenlets (the gevent and eventlet pools) share one OS thread,
where asyncio allows only one running loop: there, one loop runs on a thread of its own (a
greenlet, once the process is patched) and every greenlet hands its coroutine to it
(``run_coroutine_threadsafe``) and waits for the outcome, which yields to the hub. So the
coroutines of all the pool's greenlets run at once on that loop, and the loop's selector, patched
too, parks only its own greenlet while it waits. The asyncio pool does not use this module: it
awaits coroutines on its own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

#: Seconds ``close`` waits for the shared loop's thread to end.
CLOSE_WAIT = 5.0


class Loops:
    """Event loops for coroutines run from synchronous code: one per thread, or (``shared``)
    one for every caller."""

    def __init__(self, shared: bool = False) -> None:
        self.shared = shared
        self._local = threading.local()
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the shared one, once started
        self._thread: threading.Thread | None = None

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` to its end and return its result (or raise its exception)."""
        if not self.shared:
            loop = getattr(self._local, "loop", None)
            if loop is None:
                loop = self._local.loop = asyncio.new_event_loop()
                with self._lock:
                    self._loops.append(loop)
            return loop.run_until_complete(coroutine)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._shared())
        try:
            return future.result()
        finally:  # the caller was interrupted (a hard stop): the coroutine must not run on
            if not future.done():
                future.cancel()

    def _shared(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="hurtle-async-tasks", daemon=True
                )
                self._thread.start()
                self._loops.append(loop)
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Stop the shared loop, and close every loop not running."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            loops, self._loops = self._loops, []
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CLOSE_WAIT)
        for each in loops:
            if not each.is_running():
                each.close()
