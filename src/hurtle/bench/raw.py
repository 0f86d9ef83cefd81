"""The raw redis-py loops hurtle is measured against: no framework, no acknowledgement.

Messages are msgpack maps ``{"id": <16 hex digits>, "task": "add", "args": [5, 6]}`` on one list,
``bench:raw``: the least a task message carries (without an id nothing can be acknowledged,
retried or traced; without a name, no function can be chosen). Publish
kinds: ``single`` (one ``LPUSH`` per task), ``pipelined`` (``LPUSH`` per task, 1,000 per pipeline
round trip), ``multi`` (one ``LPUSH`` carrying 1,000 values). Consume kinds: ``single`` (one
``BLPOP`` per task) and ``batch`` (``LPOP key 1000``); both decode each message and call the
function it names.

    python -m hurtle.bench.publish hurtle.bench.raw:publish_KIND COUNT
    python -m hurtle.bench.raw consume KIND COUNT
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec

import redis

from .probe import hit

KEY = "bench:raw"
BATCH = 1000


def add(x: int, y: int) -> int:
    hit()
    return x + y


FUNCTIONS: dict[str, Callable[..., Any]] = {"add": add}


def _client() -> redis.Redis:
    return redis.Redis.from_url(os.environ["HURTLE_BENCH_REDIS_URL"])


def publish_kind(kind: str, count: int, progress: Callable[[int], None]) -> int:
    r = _client()
    encode = msgspec.msgpack.encode
    sent = 0

    def message() -> bytes:
        return encode({"id": os.urandom(8).hex(), "task": "add", "args": [5, 6]})

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
            message = decode(cast(bytes, item[1]))
            functions[message["task"]](*message["args"])
            done += 1
        else:
            raws = cast("list[bytes] | None", r.lpop(KEY, BATCH))
            if not raws:
                item = r.blpop([KEY], timeout=1)  # idle: wait server-side, not in a spin
                if item is None:
                    continue
                raws = [cast(bytes, item[1])]
            for raw in raws:
                message = decode(raw)
                functions[message["task"]](*message["args"])
            done += len(raws)
    return done


def main(argv: list[str]) -> int:
    command, kind, count = argv[0], argv[1], int(argv[2])
    if command == "consume":
        consume(kind, count)
        while True:  # stay up, like a worker, until the driver stops it (and reads our RSS)
            time.sleep(3600)
    raise SystemExit(
        f"unknown command {command!r}: use consume (publish goes through hurtle.bench.publish)"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
