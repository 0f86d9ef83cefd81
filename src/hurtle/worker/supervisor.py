"""``Supervisor``: runs N worker processes, replaces those that die, and stops them on a signal.

Each child is a fresh interpreter (``python -m hurtle worker ...``), never a fork: a fork would
share the parent's broker connections and locks. Children run in their own process group, so a
terminal's Ctrl-C reaches only the supervisor, which forwards it once; a second SIGTERM/SIGINT is
forwarded again, which makes the children hand back their running tasks and exit at once.

A child that dies while it should run is started again (after a short backoff if it died young);
what it held comes back through the heartbeat like any crashed worker's. A child that exits with
``EXIT_RECYCLE`` asked to be replaced (a task overran its time limit where it could not be
interrupted) and is replaced at once. A child that exits with ``EXIT_USAGE`` met a configuration
error that a restart cannot fix: everything stops and the supervisor exits 2. With ``burst``, a
child that exits 0 has drained its queues and is not replaced.

A signal may land at any moment, also while children are being started or restarted: once the
supervisor is stopping it starts no child, and a child started while the signal was being handled
is sent the signals it missed (each child counts what it was sent). A child that dies of the
forwarded SIGTERM itself (it was still starting and had no handler yet, so it held nothing) has
stopped cleanly.

The supervisor imports no user code and opens no broker connection.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)

#: A worker's exit status when it stopped to be replaced by a fresh process.
EXIT_RECYCLE = 75
#: A configuration error (the CLI's status for errors a user can fix).
EXIT_USAGE = 2


class Stoppable(Protocol):
    """A child process and the stop signals it has been sent: the supervisor's children, and
    the worker that ``hurtle worker --watch`` runs."""

    proc: subprocess.Popen[bytes] | None
    sent: int


def catch_up(child: Stoppable, signals: int) -> None:
    """Send ``child`` the stop signals (SIGTERM, one per signal received, at most two) it has
    not been sent yet, each counted before it goes: a signal handled meanwhile (this runs in
    signal handlers) sees it counted and does not send it again."""
    proc = child.proc
    while proc is not None and child.sent < min(signals, 2):
        child.sent += 1
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)


class _Child:
    __slots__ = ("done", "index", "proc", "restarts", "sent", "started")

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.restarts = 0
        self.done = False
        self.sent = 0  # stop signals sent to the current process


class Supervisor:
    """Keeps ``processes`` children of ``command`` (``hurtle`` CLI arguments) running."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        burst: bool = False,
        env: dict[str, str] | None = None,
        poll_interval: float = 0.1,
    ) -> None:
        self.command = list(command)
        self.processes = processes
        self.burst = burst
        self.env = env
        self.poll_interval = poll_interval
        self.children = [_Child(i) for i in range(processes)]
        self._signals = 0
        self._wake = threading.Event()
        self._failed = False
        self._usage_error = False

    # -- signals ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.info("%s received: stopping %d worker processes gracefully", name, self.processes)
        elif self._signals == 2:
            log.warning(
                "%s received again: worker processes hand back their tasks and stop now", name
            )
        else:
            return
        self._forward()
        self._wake.set()

    def stop(self) -> None:
        """Stop the children gracefully (as the first SIGTERM does)."""
        self._on_signal(signal.SIGTERM, None)

    @property
    def stopping(self) -> bool:
        return self._signals > 0

    def _forward(self) -> None:
        for child in self.children:
            self._catch_up(child)

    def _catch_up(self, child: _Child) -> None:
        catch_up(child, self._signals)

    # -- children --------------------------------------------------------------------------

    def _spawn(self, child: _Child) -> None:
        if self.stopping:
            child.done = True
            return
        argv = [sys.executable, "-m", "hurtle", *self.command]
        child.proc = None  # a signal handled from here on is sent by the catch-up below
        child.sent = 0
        child.proc = self._popen(argv)
        child.started = time.monotonic()
        log.info("started worker process %d (pid %d)", child.index + 1, child.proc.pid)
        self._catch_up(child)  # a signal handled while it was being started

    def _popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, env=self.env, process_group=0)

    def _reap(self, child: _Child, code: int) -> None:
        """Decide what happens after a child exited with ``code``."""
        proc = child.proc
        assert proc is not None
        how = f"exit status {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        if self.stopping:
            child.done = True
            if code == -signal.SIGTERM and child.sent:
                log.info(
                    "worker process pid %d stopped by the signal before it could handle "
                    "it (it was still starting)",
                    proc.pid,
                )
            elif code != 0:
                self._failed = True
                log.warning("worker process pid %d stopped with %s", proc.pid, how)
            return
        if code == 0 and self.burst:
            child.done = True
            return
        if code == EXIT_USAGE:
            log.error("worker process pid %d exited with a configuration error: stopping", proc.pid)
            self._usage_error = True
            child.done = True
            self.stop()
            return
        if code == EXIT_RECYCLE:
            log.info("worker process pid %d asked to be replaced", proc.pid)
        else:
            log.error(
                "worker process pid %d died (%s): starting another; what it held "
                "comes back once its heartbeat lapses",
                proc.pid,
                how,
            )
            lived = time.monotonic() - child.started
            child.restarts = child.restarts + 1 if lived < 5.0 else 0
            if child.restarts:
                self._wake.wait(min(0.5 * 2 ** (child.restarts - 1), 10.0))
                if self.stopping:
                    child.done = True
                    return
        self._spawn(child)

    # -- running ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run until every child has stopped; 0 if all stopped cleanly, 2 on a usage error."""
        for child in self.children:
            self._spawn(child)  # starts none once stopping
        while not all(child.done for child in self.children):
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            for child in self.children:
                if child.done or child.proc is None:
                    continue
                code = child.proc.poll()
                if code is not None:
                    self._reap(child, code)
        if self._usage_error:
            return EXIT_USAGE
        if self._failed:
            return 1
        log.info("all %d worker processes stopped", self.processes)
        return 0
