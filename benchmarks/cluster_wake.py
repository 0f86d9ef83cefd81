"""How fast an idle consumer of three queues wakes when one message arrives, on one Redis and on a
Redis Cluster (where it waits on one connection per queue: ``brokers/redis/cluster.py``).

    python benchmarks/cluster_wake.py redis://127.0.0.1:6379/0 200
    python benchmarks/cluster_wake.py redis+cluster://127.0.0.1:7000 200

Each round: the consumer blocks in ``fetch``; one message is published to one of the queues
(``bench-0``, ``bench-2``, ``bench-3``: one per master of a 3-master cluster) at random, timed
from before the publish to the fetch's return. The queues are emptied by the consumer itself.
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time

from hurtle.brokers import Delivery, make_broker

QUEUES = ["bench-0", "bench-2", "bench-3"]


def main(url: str, rounds: int) -> None:
    broker, publisher = make_broker(url), make_broker(url)
    consumer = broker.consumer(QUEUES)
    latencies: list[float] = []
    try:
        for _ in range(rounds):
            got: list[Delivery] = []
            woke: list[float] = []
            started = threading.Event()

            def wait(
                got: list[Delivery] = got,
                woke: list[float] = woke,
                started: threading.Event = started,
            ) -> None:
                started.set()
                got.extend(consumer.fetch(1, 30))
                woke.append(time.perf_counter())

            waiter = threading.Thread(target=wait)
            waiter.start()
            started.wait()
            time.sleep(0.02)  # let it block
            sent = time.perf_counter()
            publisher.publish_raw(random.choice(QUEUES), [b"x"])
            waiter.join()
            consumer.ack(got)
            latencies.append((woke[0] - sent) * 1000)
    finally:
        consumer.close()
        broker.close()
        publisher.close()
    latencies.sort()
    print(
        f"{url.split(':')[0]:14} wake latency ms: median {statistics.median(latencies):.2f}  "
        f"p90 {latencies[int(0.9 * rounds)]:.2f}  max {latencies[-1]:.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200)
