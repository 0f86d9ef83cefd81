"""A dependency-free progress bar for the terminal (and plain lines when not a terminal).

On a terminal the bar is redrawn in place on the last line, and the log lines written to the
same terminal meanwhile (a worker's, say) never share its line: while a bar is shown, the
logging handlers that write to its stream write through it, clearing the bar's line before a
log line and drawing the bar again after it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TextIO

#: Back to the start of the line, and erase it.
_CLEAR = "\r\x1b[K"


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()
        self._last_draw = 0.0
        self._last_tenth = -1
        self._lock = threading.Lock()
        self._shown = ""  # the bar as last drawn, while on screen
        self._handlers: list[logging.StreamHandler[TextIO]] = []
        if self.tty:
            self._take_handlers()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        fraction = min(done / self.total, 1.0)
        if self.tty:
            if now - self._last_draw < 0.1 and done < self.total:
                return
            self._last_draw = now
            width = 30
            filled = int(width * fraction)
            rate = done / max(now - self.started, 1e-9)
            bar = (
                f"{self.label:<8} [{'#' * filled}{'.' * (width - filled)}] "
                f"{done:>9,}/{self.total:,}  {rate:>10,.0f}/s"
            )
            with self._lock:
                self._shown = bar
                self.stream.write("\r" + bar)
                self.stream.flush()
        else:
            tenth = int(fraction * 10)
            if tenth > self._last_tenth:
                self._last_tenth = tenth
                self.stream.write(f"{self.label}: {done:,}/{self.total:,} ({tenth * 10}%)\n")
                self.stream.flush()

    def finish(self, done: int) -> None:
        self.update(done)
        if self.tty:
            with self._lock:
                self._shown = ""
                self.stream.write("\n")
                self.stream.flush()
            self._give_back_handlers()

    # -- log lines on the bar's terminal ---------------------------------------------------

    def _take_handlers(self) -> None:
        """Make the root logger's handlers that write to the bar's stream write through it."""
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and handler.stream is self.stream:
                handler.setStream(_Through(self))
                self._handlers.append(handler)

    def _give_back_handlers(self) -> None:
        for handler in self._handlers:
            handler.setStream(self.stream)
        self._handlers.clear()

    def write_line(self, text: str) -> None:
        """Write ``text`` (a log line) on a line of its own, then the bar again below it."""
        with self._lock:
            if self._shown:
                self.stream.write(_CLEAR)
            self.stream.write(text)
            if self._shown and text.endswith("\n"):
                self.stream.write(self._shown)
            self.stream.flush()


class _Through:
    """The stream a logging handler writes to while a bar is shown: the bar's own."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar

    def write(self, text: str) -> int:
        self.bar.write_line(text)
        return len(text)

    def flush(self) -> None:
        pass
