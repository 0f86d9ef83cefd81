"""``hurtle demo``: the main job on the embedded default, with no server and no user file.

Sends ``--count`` trivial ``add(x, y)`` calls with ``send_many`` to a fresh SQLite queue, runs a
solo worker on them in this process, and reports publish and consume throughput. Consume time runs
from the worker's start to the end of the last task; that every task ran is checked by counting
correct sums.

With ``--broker URL`` (a broker of the user's) the demo sends to a queue of its own with a unique
name (``hurtle-demo-<id>``), consumes only that queue, and afterwards removes only the dead
letters of that queue: nothing of the user's is touched. The empty queue's name stays known to
the broker.

Its worker's call lines are left out (the ``hurtle.worker.log`` logger is set to WARNING while
the demo runs): the demo reports the calls as a whole. Other log lines do not share the progress
bar's line (``_progress``).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..app import Hurtle
from ..ids import new_id
from ..worker import log as call_log
from ._progress import Progress


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="send and run N tasks on the embedded queue and report tasks/s"
    )
    p.add_argument("--count", "-n", type=int, default=100_000, help="tasks (default 100,000)")
    p.add_argument(
        "--broker",
        default=None,
        help="broker URL (default: a fresh SQLite file in a temporary directory)",
    )
    p.add_argument("--batch", type=int, default=1000, help="calls per send_many (default 1000)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="hurtle-demo-") as tmp:
        url = args.broker or f"sqlite:///{Path(tmp) / 'demo.db'}"
        result = demo(url, args.count, args.batch)
    print(
        f"published {result['count']:,} tasks in {result['publish_s']:.2f}s "
        f"({result['publish_rate']:,.0f} tasks/s)\n"
        f"consumed  {result['processed']:,} tasks in {result['consume_s']:.2f}s "
        f"({result['consume_rate']:,.0f} tasks/s)\n"
        f"results: {result['ok']:,} correct sums, {result['dead']} dead letters, broker {url}"
    )
    return 0 if result["ok"] == result["count"] else 1


def demo(url: str, count: int, batch: int = 1000, *, quiet: bool = False) -> dict[str, Any]:
    app = Hurtle(url, heartbeat_timeout=10)
    queue = f"hurtle-demo-{new_id()}"  # its own: the demo never touches the user's queues
    sums = [0]
    finished = [0.0]

    @app.task(name="demo.add", queue=queue)
    def add(x: int, y: int) -> int:
        total = x + y
        if total == 11:
            sums[0] += 1  # the solo pool runs one task at a time: no lock needed
        finished[0] = time.perf_counter()
        return total

    stream = open(os.devnull, "w") if quiet else None  # noqa: SIM115
    bar = Progress("publish", count, stream)
    started = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        add.send_many([(5, 6)] * n)
        sent += n
        bar.update(sent)
    publish_s = time.perf_counter() - started
    bar.finish(sent)

    worker = app.worker(queues=[queue], pool="solo", burst=True)
    bar = Progress("consume", count, stream)
    calls = logging.getLogger(call_log.__name__)
    level = calls.level
    calls.setLevel(max(logging.WARNING, calls.getEffectiveLevel()))  # its failures still show
    started = time.perf_counter()
    try:
        thread = worker.run_in_thread()
        while thread.is_alive():
            thread.join(0.1)
            bar.update(worker.processed)
    finally:
        calls.setLevel(level)
    # until the last task ended: a burst worker takes a few more ms to see the queue is empty
    consume_s = (finished[0] or time.perf_counter()) - started
    bar.finish(worker.processed)
    dead = app.broker.stats([queue])[queue].dead
    if dead:
        app.broker.purge_dead(queue)
    app.close()
    if stream is not None:
        stream.close()
    return {
        "count": count,
        "processed": worker.processed,
        "ok": sums[0],
        "dead": dead,
        "publish_s": publish_s,
        "consume_s": consume_s,
        "publish_rate": count / publish_s if publish_s else 0.0,
        "consume_rate": worker.processed / consume_s if consume_s else 0.0,
    }
