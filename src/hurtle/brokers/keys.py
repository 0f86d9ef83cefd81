"""Every Redis key name hurtle uses, built here and nowhere else.

All keys of one queue share the hash tag ``{queue}`` so that they live in one Redis Cluster slot
and every Lua script touches a single slot (``redis/cluster.py``); keys outside a queue are never
touched from a queue's script on a Redis Cluster (on one server, the dead-letter index and the
records of failed workflows are). The only key outside a queue is the ``hurtle:queues``
set of known queue names, which scripts never touch, and the three keys of workers' reports
(``reports.py``), written by plain commands in the heartbeat's round trip.

Cancellations live outside any queue too (who cancels knows only message ids):
``hurtle:cancelled`` (a ZSET of ids scored by when each cancellation ends); each queue's
``cancels`` flag tells its fetch script, under the queue's own hash tag, that the set may hold a
live id.

Dead letters are found by message id through ``hurtle:dead:index`` (who looks one up knows only
the id): the queue scripts that write or remove dead letters keep it in the same step on one
server; on a Redis Cluster, where it has a slot of its own, they hand their changes back and the
caller applies them right after (``redis/deadletters.py``).

Results live outside any queue: ``hurtle:results:{BUCKET}``, a HASH of message id -> the
result's expiry (13 digits, server milliseconds) then its payload, where BUCKET is the id less
its last 3 bytes (a reader knows only the id; consecutive ids of one publisher share a hash, so
a batch of results is a few writes). A result reads as absent once its own expiry has passed;
the hash expires when the last result written to it does. And the pub/sub channel
``hurtle:results``, on which each batch of stored results announces its ids (space-separated).

Layout for queue ``q`` (``P`` = priority 0..9, ``W`` = worker id, ``B`` = batch id)::

    hurtle:queues                 SET     every queue name ever published to
    hurtle:workers:report:W       STRING  W's last report (msgpack), expiring at its deadline
    hurtle:workers:deadlines      ZSET    W, scored by the deadline of its last report
    hurtle:totals                 HASH    queue \x1f task \x1f counter -> cluster total
    hurtle:progress:{BUCKET}      HASH    message id -> its latest progress report's expiry (13
                                          digits, ms) then the report (msgpack); BUCKET as for
                                          results; the hash expires with its latest report
    hurtle:dead:index             HASH    message id -> q \x1f id of its latest dead letter
    hurtle:{q}:ready:P            LIST    raw messages of priority P; head = next to run
    hurtle:{q}:delayed            ZSET    "P:SEQ:" .. raw, scored by eta (Unix seconds)
    hurtle:{q}:inflight:W         HASH    batch id B -> how many of batch B worker W still holds
    hurtle:{q}:inflight:W:B       LIST    the payloads of batch B, in fetch order
    hurtle:{q}:inflight:W:B:done  STRING  bitmap: bit i set = message i of batch B is settled
    hurtle:{q}:fetched:W          STRING  "TOKEN B1 B2 ...": W's last fetch that took something,
                                          until a fetch with another token (expires after a week)
    hurtle:{q}:workers            ZSET    W, scored by W's deadline (server time)
    hurtle:{q}:wake               LIST    wake-up tokens that idle consumers BLPOP on
    hurtle:{q}:seq                STRING  counter for batch ids and delayed members
    hurtle:{q}:sent:0, :sent:1    SET     keys ``publish_once`` (the outbox's relay) stored lately
                                          (a row's first id in q), two generations of at most
                                          ``ONCE_KEEP`` each
    hurtle:{q}:sent:gen           STRING  which of the two is current
    hurtle:{q}:dead               ZSET    dead-letter id, scored by failure time
    hurtle:{q}:dead:raw           HASH    dead-letter id -> raw bytes
    hurtle:{q}:dead:reason        HASH    dead-letter id -> reason
    hurtle:{q}:quarantine         LIST    P .. raw: messages recovered twice, let out one at a time
    hurtle:{q}:deaths             ZSET    sha1 of a recovered raw message, scored by its deaths
    hurtle:{q}:probes             ZSET    sha1 of a quarantined message let out, scored by when
    hurtle:{q}:probe              STRING  P .. raw of the last quarantined message let out, kept
                                          until it was fetched and none waits (fetch.lua)
    hurtle:{q}:sched:N            STRING  the last tick claimed by schedule N, whose task runs on q
    hurtle:{q}:ticks:N            ZSET    the latest ticks claimed by schedule N, scored by tick
    hurtle:{q}:unique             HASH    unique lock -> "ID@END": the message holding it, until
                                          END (server seconds)
    hurtle:{q}:unique:sweep       STRING  HSCAN cursor of the sweep of expired unique locks
    hurtle:{q}:latest:K           STRING  the latest call of debounce key K sent to q (its id
                                          '@' when it was made), expiring on its own
    hurtle:{q}:latest-replaced    STRING  present while some debounced call of q may have been
                                          replaced by a later call of its key: a record of
                                          K found naming another call when one was written
                                          (latest_put.lua); it expires with the last such record
    hurtle:{q}:paused             STRING  present while q is paused: fetches take nothing from q
    hurtle:{q}:cancels            STRING  present while some cancellation may be live (its value:
                                          the latest end of one, in ms; it expires then)

Limits shared by every worker, each key under a hash tag of its own (``L`` = a limit's key)::

    hurtle:{rate:L}               STRING  GCRA theoretical arrival time (server seconds; expires)
    hurtle:{slots:L}:held         HASH    W -> concurrency slots of L that worker W holds
    hurtle:{slots:L}:alive        ZSET    W, scored by W's deadline: slots of a W past it are free

A fetch records what it took as one in-flight *batch* per priority (``B = SEQ * 10 + P``), so that
recording and acknowledging a thousand messages costs a few commands rather than a thousand hash
fields. The batch keys are built inside the scripts from the worker's in-flight key (same hash
tag), since their ids are only known there. A delivery's receipt is ``B << 20 | i``.
"""

from __future__ import annotations

from functools import lru_cache

from ..message import MAX_PRIORITY

PREFIX = "hurtle"
#: The set of every queue name hurtle has seen.
QUEUES = f"{PREFIX}:queues"
#: Workers' last reports, their deadlines, and the cluster's counters (``reports.py``).
WORKER_REPORT = f"{PREFIX}:workers:report:"  # + the worker id
WORKER_DEADLINES = f"{PREFIX}:workers:deadlines"
TOTALS = f"{PREFIX}:totals"
#: Dead letters by message id: message id -> queue "\x1f" dead-letter id.
DEAD_INDEX = f"{PREFIX}:dead:index"

#: The channel that announces stored results (their ids, space-separated).
RESULTS_CHANNEL = f"{PREFIX}:results"
#: Cancelled message ids, each scored by the end of its cancellation (Unix seconds).
CANCELLED = f"{PREFIX}:cancelled"
#: The prefix of the hashes of running tasks' progress reports, bucketed by id as results are
#: (``progress_key``).
PROGRESS = f"{PREFIX}:progress:"


#: Results are kept in hashes, one per run of ids that differ only in their last
#: ``RESULT_BUCKET_CUT`` bytes (4096 consecutive ids of one publisher): a batch of results is a
#: few ``HSET`` calls, not a key (and an expiry) per result.
RESULT_BUCKET_CUT = 3
#: ``result_key(id)`` is this, the bytes of the id less its last ``RESULT_BUCKET_CUT``, then "}".
RESULT_KEY_PREFIX = f"{PREFIX}:results:{{"


#: ``result_key(id)`` then this: the hash of the batches of records of the same bucket, each
#: stored whole (``redis/results.py``), in the same slot of a cluster.
RESULT_BATCHES_SUFFIX = ":batches"


def progress_key(id: str) -> bytes:
    """The key of the hash that holds the progress report of message ``id`` (field: the id):
    a worker's reports of one interval are a few ``HSET`` commands, not one per report."""
    raw = id.encode()
    return b"%s{%s}" % (PROGRESS.encode(), raw[: max(len(raw) - RESULT_BUCKET_CUT, 0)])


def result_key(id: str) -> bytes:
    """The key of the hash that holds the result of message ``id`` (field: the id)."""
    raw = id.encode()
    return b"%s%s}" % (RESULT_KEY_PREFIX.encode(), raw[: max(len(raw) - RESULT_BUCKET_CUT, 0)])


def result_batches_key(id: str) -> bytes:
    """The key of the hash of the batches that may hold the result of message ``id``."""
    return result_key(id) + RESULT_BATCHES_SUFFIX.encode()


class QueueKeys:
    """The keys of one queue; made once per name by ``queue_keys``."""

    __slots__ = (
        "cancels",
        "dead",
        "dead_raw",
        "dead_reason",
        "deaths",
        "delayed",
        "inflight_prefix",
        "latest_prefix",
        "name",
        "paused",
        "probe",
        "probes",
        "quarantine",
        "ready",
        "replaced",
        "sent",
        "seq",
        "unique",
        "unique_sweep",
        "wake",
        "workers",
    )

    def __init__(self, name: str) -> None:
        base = f"{PREFIX}:{{{name}}}:"
        self.name = name
        #: Ready lists indexed by priority: ``ready[0]`` is the lowest.
        self.ready: tuple[str, ...] = tuple(f"{base}ready:{p}" for p in range(MAX_PRIORITY + 1))
        self.delayed = f"{base}delayed"
        self.workers = f"{base}workers"
        self.wake = f"{base}wake"
        self.seq = f"{base}seq"
        #: ``publish_once``'s generations of the keys it stored: this then 0, 1 or gen.
        self.sent = f"{base}sent:"
        self.dead = f"{base}dead"
        self.dead_raw = f"{base}dead:raw"
        self.dead_reason = f"{base}dead:reason"
        self.quarantine = f"{base}quarantine"
        self.deaths = f"{base}deaths"
        self.probes = f"{base}probes"
        self.probe = f"{base}probe"
        self.unique = f"{base}unique"
        self.unique_sweep = f"{base}unique:sweep"
        self.paused = f"{base}paused"
        self.cancels = f"{base}cancels"
        #: Scripts that recover dead workers append the worker id to this.
        self.inflight_prefix = f"{base}inflight:"
        self.latest_prefix = f"{base}latest:"
        #: Exists while some debounced call of this queue may have been replaced by a later
        #: call of its key (``latest_put.lua`` raises it, the fetch script reads it): while it
        #: does not, no latest record names another call than its own.
        self.replaced = f"{base}latest-replaced"

    def latest(self, key: str) -> str:
        """The record of the latest call of the debounce key ``key`` sent to this queue."""
        return f"{self.latest_prefix}{key}"

    def inflight(self, worker_id: str) -> str:
        """The index of the batches ``worker_id`` holds from this queue."""
        return f"{self.inflight_prefix}{worker_id}"

    def schedule(self, name: str) -> str:
        """The last tick of the schedule ``name``, whose messages go to this queue."""
        return f"{PREFIX}:{{{self.name}}}:sched:{name}"

    def schedule_ticks(self, name: str) -> str:
        """The latest ticks claimed by the schedule ``name`` (``brokers.ticks.RECENT_TICKS``)."""
        return f"{PREFIX}:{{{self.name}}}:ticks:{name}"

    def fetched(self, worker_id: str) -> str:
        """The record of the last fetch of ``worker_id`` from this queue that took something."""
        return f"{PREFIX}:{{{self.name}}}:fetched:{worker_id}"


def rate_key(key: str) -> str:
    """Where the rate limit ``key`` keeps its state."""
    return f"{PREFIX}:{{rate:{key}}}"


def slot_keys(key: str) -> tuple[str, str]:
    """The concurrency limit ``key``'s holders hash and their deadlines zset (one hash tag)."""
    base = f"{PREFIX}:{{slots:{key}}}"
    return f"{base}:held", f"{base}:alive"


@lru_cache(maxsize=4096)
def queue_keys(name: str) -> QueueKeys:
    """The keys of queue ``name`` (cached: building them is off the hot path)."""
    return QueueKeys(name)


#: A receipt is ``batch_id << BATCH_BITS | index``: a batch holds fewer than 2**20 messages.
BATCH_BITS = 20
BATCH_MASK = (1 << BATCH_BITS) - 1


def chord_key(id: str) -> str:
    """The hash of chord ``id``: its members' results by index, and ``fired`` once its
    callback is published."""
    return f"{PREFIX}:chord:{{{id}}}"
