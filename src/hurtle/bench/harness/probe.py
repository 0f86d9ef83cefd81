"""The in-worker probe: counts tasks and keeps the time of the first and the last, per process.

Every benchmarked task body calls ``done()``: one counter increment and one ``time.monotonic()``
read, no I/O. A daemon thread (started on the first task, so after any fork) writes the
process's totals to ``$HURTLE_BENCH_PROBE_DIR/<pid>.json`` every ``INTERVAL`` seconds and at exit;
the driver sums the files. (A worker that forks a process per task appends one record per task
to ``forked.log`` instead: see ``done_appending``.) Times are ``CLOCK_MONOTONIC`` seconds, one
clock for every process on the host (Ruby's ``Process.clock_gettime(Process::CLOCK_MONOTONIC)``
reads the same one).

The file is for reporting only: the end of a run is the largest ``last`` any process recorded, not
the moment the driver read it.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

ENV_DIR = "HURTLE_BENCH_PROBE_DIR"
INTERVAL = 0.05

_monotonic = time.monotonic
_lock = threading.Lock()
_count = 0
_first = 0.0
_last = 0.0


def done() -> None:
    """Record one finished task (hot path: no I/O, no system call beyond the clock read)."""
    global _count, _last
    _last = _monotonic()
    if not _count:
        _start()
    _count += 1


def done_locked() -> None:
    """``done()`` for pools that run tasks on several threads at once."""
    with _lock:
        done()


_LINE = 21  # "%020.9f\n": one fixed-size record per task in the append file


def done_appending() -> None:
    """``done()`` for workers that fork a process per task (RQ's default), whose memory dies
    with each task: append the finish time to ``forked.log`` (one small ``O_APPEND`` write)."""
    now = _monotonic()
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return
    fd = os.open(os.path.join(directory, "forked.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, b"%020.9f\n" % now)
    finally:
        os.close(fd)


#: What a task body calls: ``done``; ``done_locked`` when ``HURTLE_BENCH_PROBE_LOCK`` is set
#: (tasks run on several threads of one process); ``done_appending`` when
#: ``HURTLE_BENCH_PROBE_APPEND`` is set (a process per task).
hit = (
    done_appending
    if os.environ.get("HURTLE_BENCH_PROBE_APPEND")
    else done_locked
    if os.environ.get("HURTLE_BENCH_PROBE_LOCK")
    else done
)


def _reset() -> None:
    global _count, _first, _last
    _count, _first, _last = 0, 0.0, 0.0


os.register_at_fork(after_in_child=_reset)


def _start() -> None:
    global _first
    _first = _last
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return
    path = Path(directory) / f"{os.getpid()}.json"
    thread = threading.Thread(target=_report_forever, args=(path,), name="bench-probe", daemon=True)
    thread.start()
    atexit.register(_write, path)


def _write(path: Path) -> None:
    snapshot = {"count": _count, "first": _first, "last": _last, "pid": os.getpid()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot))
    os.replace(tmp, path)


def _report_forever(path: Path) -> None:
    written = -1
    while True:
        if _count != written:
            written = _count
            _write(path)
        time.sleep(INTERVAL)


def read(directory: Path) -> dict[str, Any]:
    """Sum the probe files in ``directory``: count, first (earliest), last (latest), processes."""
    count, first, last, processes = 0, 0.0, 0.0, 0
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now; the next poll reads it
        if not data.get("count"):
            continue
        processes += 1
        count += int(data["count"])
        first = float(data["first"]) if not first else min(first, float(data["first"]))
        last = max(last, float(data["last"]))
    appended = directory / "forked.log"
    if appended.exists():
        data = appended.read_bytes()
        records = len(data) // _LINE
        if records:
            times = [float(data[i * _LINE : (i + 1) * _LINE]) for i in (0, records - 1)]
            count += records
            processes += records
            first = min(first, times[0]) if first else times[0]
            last = max(last, times[1])
    return {"count": count, "first": first, "last": last, "processes": processes}
