"""Where a hurtle worker's consume time goes: cProfile of a solo burst worker on N queued tasks.

Starts its own redis-server (as ``hurtle bench tasks`` does), publishes N ``bench.add`` calls with
``send_many``, then runs ``app.worker(pool="solo", burst=True).run()`` in this process under
cProfile and prints the functions with the most time of their own. One line per function;
a profile is a map of the hot path, not a timing (cProfile slows every Python call).

    python benchmarks/profile_hurtle_worker.py [N] [sqlite | postgresql://user@host/database]

With a PostgreSQL URL the tasks go to that database (to its schema ``hurtle``, or the URL's
``?schema=``, which should hold no other messages) and no server is started.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import tempfile
import time

from hurtle.bench.harness.servers import RedisServer


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    server = None
    with tempfile.TemporaryDirectory(prefix="hurtle-profile-") as tmp:
        store = sys.argv[2] if len(sys.argv) > 2 else "redis"
        if store == "sqlite":
            os.environ["HURTLE_BROKER_URL"] = f"sqlite:///{tmp}/profile.db"
        elif store.startswith(("postgresql://", "postgres://")):
            os.environ["HURTLE_BROKER_URL"] = store
        else:
            server = RedisServer()
            os.environ["HURTLE_BROKER_URL"] = server.url
        try:
            from hurtle.bench.peers import hurtle_app

            hurtle_app.publish(count, lambda sent: None)
            worker = hurtle_app.app.worker(pool="solo", burst=True)
            profile = cProfile.Profile()
            started = time.perf_counter()
            profile.runcall(worker.run)
            seconds = time.perf_counter() - started
            print(
                f"{worker.processed:,} tasks in {seconds:.2f}s under cProfile "
                f"({worker.processed / seconds:,.0f}/s; unprofiled is several times faster)"
            )
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
