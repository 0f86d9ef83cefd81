"""``Broker.purge`` on NATS: drop what waits in a queue, never what a worker holds.

A subject-wide stream purge would also drop the messages workers hold (JetStream keeps them in
the stream until acknowledged) and with them what recovery hands back, so each part is emptied
its own way:

* the delayed subject is purged whole: nothing there is held by a worker (its promoters only
  hold messages to hand them over when due);
* each priority level is pulled in batches through its durable consumer and acknowledged at
  once (pulls only hand out what no worker holds);
* quarantine lets out one message at a time, so its waiting messages (those after the last
  its consumer delivered) are deleted one by one.

These are several steps, not one: a message published meanwhile may be dropped or kept.
"""

from __future__ import annotations

import json

from nats.js.errors import APIError, NotFoundError

from . import names
from .pull import Puller
from .store import Store

#: Messages pulled per batch while purging a priority level.
PURGE_BATCH = 1000


async def purge(store: Store, queue: str) -> int:
    if not await store.queue_exists(queue):
        return 0
    stream = names.stream(queue)
    reply = await store.request(
        f"$JS.API.STREAM.PURGE.{stream}",
        json.dumps({"filter": names.subject(queue, names.DELAYED)}).encode(),
    )
    dropped = int(json.loads(reply.data).get("purged", 0))
    puller = Puller(store.nc)
    await puller.start()
    try:
        for level in names.LEVELS:
            if level == names.QUARANTINE:
                continue
            while True:
                got = await puller.pull(queue, level, PURGE_BATCH)
                if not got:
                    break
                await store.settle([m.reply for m in got], b"+ACK")
                dropped += len(got)
    finally:
        await puller.stop()
    return dropped + await _drop_quarantined(store, queue)


async def _drop_quarantined(store: Store, queue: str) -> int:
    stream = names.stream(queue)
    subject = names.subject(queue, names.QUARANTINE)
    info = await store.js.consumer_info(stream, names.durable(names.QUARANTINE))
    seq = (info.delivered.stream_seq or 0) + 1
    dropped = 0
    while True:
        try:
            msg = await store.js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return dropped
        seq = msg.seq + 1
        try:
            await store.js.delete_msg(stream, msg.seq)
        except APIError:  # let out and acknowledged meanwhile
            continue
        dropped += 1
