"""What frames could reach at most: the raw per-message Redis loop against a raw loop of frames.

A *frame* (issue "frames: past the raw loop") is one list element holding a ``send_many`` batch:
one msgspec encode of the batch's messages on the way in, one decode on the way out. Before
hurtle stores frames, this measures the ceiling of the idea with no framework at all, on a
private ``redis-server``, for N ``add(5, 6)`` messages in hurtle's own ``Message`` format:

* ``per-message``: pipelined ``LPUSH`` of 1,000 encoded messages per round trip; consumed with
  ``LPOP key 1000``, each decoded and called (the ``raw-batch`` row of ``hurtle bench tasks``,
  with hurtle's message instead of a two-key dict);
* ``frames``: one ``LPUSH`` of one element per 1,000 messages (``list[Message]`` encoded once);
  consumed with ``LPOP key 10``, each frame decoded in one call and its messages called.

ROUNDS rounds alternate the two; it prints each round's rates and the medians' ratio. Nothing is
acknowledged in either loop: the ratio is the most frames can give hurtle's loop, which also
acknowledges, keeps outcomes per message and screens cancellations.

    python benchmarks/frames_ceiling.py [N] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

import msgspec

import redis
from hurtle.bench.harness.servers import RedisServer
from hurtle.ids import new_id
from hurtle.message import Message

KEY = "frames:q"
BATCH = 1000


def add(x: int, y: int) -> int:
    return x + y


def messages(n: int) -> list[Message]:
    now = time.time()
    return [Message(id=new_id(), task="add", queue="q", args=(5, 6), created=now) for _ in range(n)]


def per_message(r: redis.Redis, batch: list[Message], count: int) -> tuple[float, float]:
    encode = msgspec.msgpack.Encoder().encode
    started = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for _ in range(count // BATCH):
        pipe.lpush(KEY, *[encode(m) for m in batch])
        pipe.execute()
    published = time.perf_counter() - started
    decode = msgspec.msgpack.Decoder(Message).decode
    functions = {"add": add}
    started, done = time.perf_counter(), 0
    while done < count:
        for raw in r.lpop(KEY, BATCH) or ():  # type: ignore[union-attr]
            m = decode(raw)
            functions[m.task](*m.args)
            done += 1
    return count / published, count / (time.perf_counter() - started)


def frames(r: redis.Redis, batch: list[Message], count: int) -> tuple[float, float]:
    encode = msgspec.msgpack.Encoder().encode
    started = time.perf_counter()
    for _ in range(count // BATCH):
        r.lpush(KEY, encode(batch))
    published = time.perf_counter() - started
    decode = msgspec.msgpack.Decoder(list[Message]).decode
    functions = {"add": add}
    started, done = time.perf_counter(), 0
    while done < count:
        for frame in r.lpop(KEY, 10) or ():  # type: ignore[union-attr]
            for m in decode(frame):
                functions[m.task](*m.args)
                done += 1
    return count / published, count / (time.perf_counter() - started)


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    count -= count % BATCH
    server = RedisServer()
    try:
        r = redis.Redis.from_url(server.url)
        batch = messages(BATCH)
        ratios: dict[str, list[float]] = {"publish": [], "consume": []}
        for n in range(rounds):
            r.delete(KEY)
            pm = per_message(r, batch, count)
            r.delete(KEY)
            fr = frames(r, batch, count)
            ratios["publish"].append(fr[0] / pm[0])
            ratios["consume"].append(fr[1] / pm[1])
            print(
                f"round {n + 1}: publish {pm[0]:,.0f} vs frames {fr[0]:,.0f}/s, "
                f"consume {pm[1]:,.0f} vs frames {fr[1]:,.0f}/s"
            )
        for what, values in ratios.items():
            print(
                f"{what}: frames / per-message {statistics.median(values):.2f}x "
                f"({min(values):.2f}-{max(values):.2f})"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
