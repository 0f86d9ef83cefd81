"""The raw redis-py loops hurtle is measured against: no framework, no acknowledgement.

Messages (``raw_loop.message``) go on one list, ``bench:raw``. Publish kinds: ``single`` (one
``LPUSH`` per task), ``pipelined`` (``LPUSH`` per task, 1,000 per pipeline round trip),
``multi`` (one ``LPUSH`` carrying 1,000 values). Consume kinds: ``single`` (one ``BLPOP`` per
task) and ``batch`` (``LPOP key 1000``); both decode each message and call the function it
names.

    python -m hurtle.bench.harness.publish hurtle.bench.peers.raw_redis:publish_KIND COUNT
    python -m hurtle.bench.peers.raw_redis consume KIND COUNT
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import cast

import msgspec

import redis

from .raw_loop import BATCH, FUNCTIONS, message, stay_up

KEY = "bench:raw"


def _client() -> redis.Redis:
    return redis.Redis.from_url(os.environ["HURTLE_BENCH_REDIS_URL"])


def publish_kind(kind: str, count: int, progress: Callable[[int], None]) -> int:
    r = _client()
    sent = 0
    while sent < count:
        n = min(BATCH, count - sent)
        if kind == "single":
            for _ in range(n):
                r.lpush(KEY, message())
        elif kind == "pipelined":
            pipe = r.pipeline(transaction=False)
            for _ in range(n):
                pipe.lpush(KEY, message())
            pipe.execute()
        else:
            r.lpush(KEY, *[message() for _ in range(n)])
        sent += n
        progress(sent)
    return sent


def publish_single(count: int, progress: Callable[[int], None]) -> int:
    return publish_kind("single", count, progress)


def publish_pipelined(count: int, progress: Callable[[int], None]) -> int:
    return publish_kind("pipelined", count, progress)


def publish_multi(count: int, progress: Callable[[int], None]) -> int:
    return publish_kind("multi", count, progress)


def consume(kind: str, count: int) -> int:
    r = _client()
    decode = msgspec.msgpack.decode
    functions = FUNCTIONS
    done = 0
    while done < count:
        if kind == "single":
            item = r.blpop([KEY], timeout=1)
            if item is None:
                continue
            task = decode(cast(bytes, item[1]))
            functions[task["task"]](*task["args"])
            done += 1
        else:
            raws = cast("list[bytes] | None", r.lpop(KEY, BATCH))
            if not raws:
                item = r.blpop([KEY], timeout=1)  # idle: wait server-side, not in a spin
                if item is None:
                    continue
                raws = [cast(bytes, item[1])]
            for raw in raws:
                task = decode(raw)
                functions[task["task"]](*task["args"])
            done += len(raws)
    return done


def main(argv: list[str]) -> int:
    command, kind, count = argv[0], argv[1], int(argv[2])
    if command == "consume":
        consume(kind, count)
        stay_up()
    raise SystemExit(
        f"unknown command {command!r}: use consume (publish goes through "
        "hurtle.bench.harness.publish)"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
