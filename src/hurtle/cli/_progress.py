"""A dependency-free progress bar for the terminal (and plain lines when not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()
        self._last_draw = 0.0
        self._last_tenth = -1

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
            self.stream.write(
                f"\r{self.label:<8} [{'#' * filled}{'.' * (width - filled)}] "
                f"{done:>9,}/{self.total:,}  {rate:>10,.0f}/s"
            )
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
            self.stream.write("\n")
            self.stream.flush()
