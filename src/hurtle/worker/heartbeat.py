"""``Heartbeat``: tells the broker this worker lives, and so recovers what dead workers held.

It runs on an operating-system thread of its own at a fraction of ``heartbeat_timeout``, so a long
task never makes its worker look dead. A failed beat is logged and tried again at the next tick.
While recovered messages wait in quarantine (to be let out one at a time, see the brokers), it
beats every ``SOON`` seconds instead, so that they do not wait a whole interval each.

Under gevent or eventlet, ``threading.Thread`` is a greenlet once the process is patched: a task
that computes without yielding would starve it, and peers would take the worker for dead and run
its tasks again. So the thread is started with the library's *original* thread functions, and,
because the worker's connections belong to its event loop (one OS thread), the beats go through
connections made on the heartbeat's own thread (``Consumer.heartbeat_session``).

Reports. A beat carries the worker's report (``brokers/reports.py``). While the worker is busy
(its counters moved since the last report the broker confirmed), this thread also sends the
report alone every ``REPORT_EVERY`` seconds between beats (``Consumer.send_report``: the report's
part of a beat, one round trip), and once more when the counters stop moving, so that the
dashboard's figures follow the work within a second and drop to zero when it ends; an idle
worker sends nothing between its beats. It costs the task path nothing: the thread compares the
counters it reads anyway.

What it cannot do: beat while a task holds the GIL in one long C call (a ``pow`` of a huge
number, a regex that backtracks for seconds). No Python thread runs then. When a beat comes later
than the heartbeat timeout, this module logs a warning that names the setting to raise
(``HURTLE_HEARTBEAT_TIMEOUT``): it must exceed the longest such call.
"""

from __future__ import annotations

import _thread
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from ..brokers import Consumer

log = logging.getLogger(__name__)

#: Seconds between beats while the broker has recovered messages to let out.
SOON = 0.1
#: Seconds between the reports a busy worker sends between its beats.
REPORT_EVERY = 1.0


def _thread_functions() -> tuple[Callable[..., Any], Callable[[], Any], bool]:
    """``(start_new_thread, allocate_lock, patched)``: the functions that make real OS threads
    and locks even when gevent or eventlet patched the process; ``patched`` says whether one
    did."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return (
            monkey.get_original("_thread", "start_new_thread"),
            monkey.get_original("_thread", "allocate_lock"),
            True,
        )
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        original = patcher.original("_thread")
        return original.start_new_thread, original.allocate_lock, True
    return _thread.start_new_thread, _thread.allocate_lock, False


class Heartbeat:
    def __init__(self, consumer: Consumer, interval: float) -> None:
        self.consumer = consumer
        self.interval = interval
        self.failures = 0
        self._start_thread, allocate_lock, self._patched = _thread_functions()
        self._stopping = allocate_lock()  # held until stop() releases it
        self._stopping.acquire()
        self._exited = allocate_lock()  # held until the thread's loop ends
        self._exited.acquire()
        self._started = False

    def start(self) -> None:
        self._started = True
        self._start_thread(self._run, ())

    def beat(self) -> bool:
        """Beat once; False if it failed."""
        return self._beat(self.consumer.heartbeat) is not None

    def _beat(self, heartbeat: Callable[[], bool]) -> bool | None:
        """Beat once: whether the broker asked for the next beat soon; None if it failed."""
        try:
            soon = heartbeat()
        except Exception as err:
            self.failures += 1
            log.warning("heartbeat failed (%d in a row): %s", self.failures, err)
            return None
        if self.failures:
            log.info("heartbeat restored after %d failures", self.failures)
        self.failures = 0
        return soon

    def _report(self, send: Callable[[], object]) -> bool:
        """Send the report between beats if the counters moved (or moved at the last call);
        whether they moved now."""
        reporter = self.consumer.reporter
        moved = reporter is not None and reporter.moved()
        if moved or self._moving:
            try:
                send()
            except Exception as err:  # the next beat carries it
                log.debug("sending a report between beats: %s", err)
        return moved

    _moving = False

    def _run(self) -> None:
        beat: Callable[[], bool] | None = None if self._patched else self.consumer.heartbeat
        # under gevent or eventlet, a report goes through the beat's own connections
        send = self.consumer.send_report if beat is not None else None
        end: Callable[[], None] | None = None
        timeout = self.consumer.heartbeat_timeout
        last_beat = time.monotonic()  # the worker beat once before starting this thread
        next_beat = last_beat + self.interval
        tick = min(REPORT_EVERY, self.interval)
        wait = tick
        try:
            while not self._stopping.acquire(True, wait):
                if beat is None:  # connections of this thread's own, made here
                    try:
                        beat, end = self.consumer.heartbeat_session()
                    except Exception as err:
                        self.failures += 1
                        log.warning("heartbeat failed (%d in a row): %s", self.failures, err)
                        continue
                now = time.monotonic()
                if now < next_beat:
                    self._moving = self._report(send or beat)
                    wait = max(min(tick, next_beat - time.monotonic()), 0.0)
                    continue
                soon = self._beat(beat)
                if soon is None:
                    next_beat = time.monotonic() + self.interval
                    wait = tick
                    continue
                self._moving = False  # the beat carried the report
                step = min(SOON, self.interval) if soon else self.interval
                next_beat = time.monotonic() + step
                wait = min(tick, step)
                now = time.monotonic()
                if now - last_beat > timeout:
                    log.warning(
                        "this worker went %.1fs without a heartbeat, more than its heartbeat "
                        "timeout of %gs, so other workers may have taken what it held and run "
                        "it again: a task held the GIL in one long call (or the process was "
                        "paused, or the broker slow); set HURTLE_HEARTBEAT_TIMEOUT above the "
                        "longest such call",
                        now - last_beat,
                        timeout,
                    )
                last_beat = now
        finally:
            if end is not None:
                try:
                    end()
                except Exception as err:
                    log.debug("closing the heartbeat's connections: %s", err)
            self._exited.release()

    def stop(self) -> None:
        """End the beats (``Consumer.close`` then sends the worker's last counts)."""
        if not self._started:
            return
        self._started = False
        self._stopping.release()
        self._exited.acquire(True, self.interval + 5)
