"""``hurtle worker APP --watch [PATH]``: restart the worker when the code changes (development
only).

The process the command starts watches and runs no worker: the worker (or, with
``--processes``, its supervisor) is a child process, ``python -m hurtle worker ...`` with the
same options, started again whenever a ``.py`` file under PATH (default: the current directory)
changes. A restart is a graceful stop (SIGTERM: running tasks finish, up to the shutdown
timeout, the rest goes back to the broker) and a fresh interpreter that imports the new code.
Changes are seen with ``watchfiles`` when it is installed (``pip install 'hurtle[watch]'``),
else by looking at the files' times and sizes every ``POLL_EVERY`` seconds.

The child runs in its own process group, so a terminal's Ctrl-C reaches only the watcher, which
forwards it once, as the supervisor does; a second SIGTERM/SIGINT is forwarded again and stops
the worker at once. A child that exits by itself (a syntax error in the edited module, a
``--burst`` worker that drained its queues) is started again at the next change.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

from ..errors import ConfigurationError
from ..worker.supervisor import catch_up

log = logging.getLogger(__name__)

#: Seconds between two looks at the files when ``watchfiles`` is not installed.
POLL_EVERY = 0.5
#: Directories never looked into (nor any whose name starts with a dot).
SKIPPED = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env"})

Changes = Callable[[threading.Event], Iterator[set[str]]]


def python_files(root: Path) -> dict[str, tuple[int, int]]:
    """Each ``.py`` file under ``root`` (or ``root`` itself), with its mtime and size."""
    found: dict[str, tuple[int, int]] = {}
    paths: list[str] = []
    if root.is_file():
        paths.append(str(root))
    for where, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED and not d.startswith(".")]
        paths += [os.path.join(where, f) for f in files if f.endswith(".py")]
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:  # gone between the listing and now: seen as gone
            continue
        found[path] = (st.st_mtime_ns, st.st_size)
    return found


def poll(root: Path, every: float = POLL_EVERY) -> Changes:
    """Changes under ``root`` seen by comparing the files' times and sizes every ``every`` s."""

    def changes(stop: threading.Event) -> Iterator[set[str]]:
        seen = python_files(root)
        while not stop.wait(every):
            now = python_files(root)
            if now != seen:
                changed = {p for p in now.keys() | seen.keys() if now.get(p) != seen.get(p)}
                seen = now
                yield changed

    return changes


def watcher(root: Path) -> tuple[Changes, str]:
    """How changes under ``root`` are seen (``watchfiles`` if installed), and a few words on it."""
    try:
        import watchfiles
    except ImportError:
        return poll(root), (
            f"looking every {POLL_EVERY:g} s; pip install 'hurtle[watch]' to be told at once"
        )

    # it logs each change at INFO: the reloader's own line says which files changed
    logging.getLogger("watchfiles").setLevel(logging.WARNING)

    def changes(stop: threading.Event) -> Iterator[set[str]]:
        for batch in watchfiles.watch(
            root, watch_filter=watchfiles.PythonFilter(), stop_event=stop, raise_interrupt=False
        ):
            yield {path for _, path in batch}

    return changes, "watchfiles"


class Reloader:
    """Runs ``hurtle`` with ``command`` as a child, restarted when ``path``'s code changes."""

    def __init__(self, command: Sequence[str], path: Path) -> None:
        root = path.resolve()
        if not root.exists():
            raise ConfigurationError(
                f"--watch {str(path)!r}: no such file or directory; give the directory of "
                "the code to watch"
            )
        self.command = list(command)
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.sent = 0  # stop signals sent to the current child
        self._signals = 0
        self._changes: queue.SimpleQueue[set[str]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: Times the worker was started (the first start included).
        self.starts = 0

    # -- signals ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("%s received: stopping the worker", signal.Signals(signum).name)
        self._catch_up()
        self._stop.set()
        self._wake.set()

    def _catch_up(self) -> None:
        catch_up(self, self._signals)

    # -- running ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run the worker, restarting it on changes, until a signal; the last child's status
        (0 when it stopped cleanly)."""
        changes, how = watcher(self.root)
        log.info("watching %s for changes to .py files (%s)", self.root, how)
        thread = threading.Thread(
            target=self._watch, args=(changes,), name="hurtle-watch", daemon=True
        )
        thread.start()
        self._start()
        try:
            while not self._stop.is_set():
                self._wake.wait(0.2)
                self._wake.clear()
                if self._stop.is_set():
                    break
                changed = self._take_changes()
                if changed:
                    shown = ", ".join(sorted(_relative(p, self.root) for p in changed)[:5])
                    more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
                    log.info("%s%s changed: restarting the worker", shown, more)
                    self._end_child()
                    self._take_changes()  # what changed meanwhile is in the new code too
                    self._start()
                    continue
                proc = self.proc
                if proc is not None and (code := proc.poll()) is not None:
                    log.warning(
                        "the worker exited (%s): it starts again when a file changes",
                        _how(code),
                    )
                    self.proc = None
            return self._end_child()
        finally:
            self._stop.set()  # ends the watching thread

    def _watch(self, changes: Changes) -> None:
        try:
            for changed in changes(self._stop):
                self._changes.put(changed)
                self._wake.set()
        except Exception:  # the worker runs on, unwatched
            log.exception("watching %s for changes failed: restarts stop", self.root)

    def _take_changes(self) -> set[str]:
        changed: set[str] = set()
        while True:
            try:
                changed |= self._changes.get_nowait()
            except queue.Empty:
                return changed

    def _start(self) -> None:
        if self._stop.is_set():
            return
        argv = [sys.executable, "-m", "hurtle", *self.command]
        self.proc = None  # a signal handled from here on is sent by the catch-up below
        self.sent = 0
        self.proc = subprocess.Popen(argv, process_group=0)
        self.starts += 1
        self._catch_up()  # a signal handled while it was being started

    def _end_child(self) -> int:
        """Stop the child gracefully (unless it stopped) and wait for it; its exit status."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None and self.sent == 0:
            self.sent = 1
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        while True:
            try:
                code = proc.wait(0.2)
            except subprocess.TimeoutExpired:
                continue  # signals are handled between the waits
            break
        self.proc = None
        if code == -signal.SIGTERM:  # still starting, it had no handler yet: it held nothing
            return 0
        return code


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def _how(code: int) -> str:
    return f"exit status {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
