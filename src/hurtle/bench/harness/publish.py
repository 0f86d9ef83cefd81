"""``python -m hurtle.bench.harness.publish MODULE:FUNCTION COUNT``: time one row's publishing,
alone.

``FUNCTION(count, progress)`` sends ``count`` calls of ``add(5, 6)`` the way that peer's users
would, calls ``progress(sent)`` now and then, and returns how many it sent (or a dict of
``count``, ``seconds`` it timed itself and ``notes`` for its row: the ``outbox`` row). The time
is the time spent inside it (imports and app set-up are outside; connecting to Redis, which
every peer does lazily, is inside). ``{"count": ..., "seconds": ..., "notes": [...]}`` goes to
``$HURTLE_BENCH_RESULT_FILE``, the progress to ``$HURTLE_BENCH_PROGRESS_FILE`` (at most ten
writes a second).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path


class _ProgressFile:
    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.last = 0.0

    def __call__(self, sent: int, force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (now - self.last < 0.1 and not force):
            return
        self.last = now
        self.path.write_text(str(sent))


def main(argv: list[str]) -> int:
    module_name, _, function = argv[0].partition(":")
    count = int(argv[1])
    publish = getattr(importlib.import_module(module_name), function or "publish")
    progress = _ProgressFile(os.environ.get("HURTLE_BENCH_PROGRESS_FILE"))
    started = time.perf_counter()
    sent = publish(count, progress)
    seconds = time.perf_counter() - started
    notes: list[str] = []
    if isinstance(sent, dict):  # a publisher that times itself, with notes for its row
        sent, seconds, notes = sent["count"], sent["seconds"], sent.get("notes", [])
    progress(sent, force=True)
    result = json.dumps({"count": sent, "seconds": seconds, "notes": notes})
    out = os.environ.get("HURTLE_BENCH_RESULT_FILE")
    if out:
        Path(out).write_text(result)
    else:
        print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
