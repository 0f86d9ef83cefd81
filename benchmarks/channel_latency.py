"""Latency of a channel message from another process on one host (SQLite, or any broker URL).

A publisher process sends one message (its send time) every 10 ms with ``buffer=0``; this process
subscribes and measures, per message, from the publisher's ``time.time()`` to its own on receipt.
Prints the median, p99 and max in milliseconds. The SQLite feed polls ``PRAGMA data_version`` at
intervals doubling from 0.5 ms to 4 ms, so the median should sit around 2 ms.

    python benchmarks/channel_latency.py [URL] [N]     # default: a temp SQLite file, 300
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hurtle import Hurtle


def publish(url: str, n: int) -> None:
    app = Hurtle(url)
    ch = app.channel("latency", buffer=0)
    time.sleep(0.5)  # the subscriber is listening by then
    for _ in range(n):
        ch.publish(time.time())
        time.sleep(0.01)
    app.close()


def main() -> None:
    tmp = tempfile.TemporaryDirectory()
    url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{Path(tmp.name) / 'latency.db'}"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    app = Hurtle(url)
    millis: list[float] = []
    with app.subscribe("latency") as sub:
        proc = subprocess.Popen([sys.executable, __file__, "--publish", url, str(n)])
        while len(millis) < n:
            msg = sub.get(10)
            if msg is None:
                break
            millis.append((time.time() - msg.data) * 1000)
        proc.wait()
    app.close()
    millis.sort()
    p99 = millis[max(int(len(millis) * 0.99) - 1, 0)]
    print(
        f"channel latency {url.split(':')[0]}: {len(millis)} messages, median "
        f"{statistics.median(millis):.2f} ms, p99 {p99:.2f} ms, max {millis[-1]:.2f} ms"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--publish"]:
        publish(sys.argv[2], int(sys.argv[3]))
    else:
        main()
