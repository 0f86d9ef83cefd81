"""``redis://host:port/db`` (and ``rediss://``): the production broker.

What this module owns: turning the broker contract into calls of the Lua scripts in ``lua/``, one
round trip per batch, and turning redis-py errors into ``BrokerError``. Key names come from
``keys``; every state change is one script touching the keys of one queue (one hash tag), so a
consumer of several queues runs one script per queue, and the same scripts run on a Redis Cluster
(``cluster.py``: ``redis+cluster://``).

How it works, in short:

* publish: one ``publish.lua`` call per queue, pipelined; ready messages are ``RPUSH``-ed many per
  call, delayed ones go to a zset scored by eta; a few wake-up tokens are pushed.
* fetch: ``fetch.lua`` promotes due delayed messages, ``LPOP``-s up to N (highest priority first),
  records them in this worker's in-flight hash and refreshes its heartbeat. When nothing is ready
  the consumer blocks server-side (``BLPOP`` on the queues' wake lists) until a publish pushes a
  token, the next delayed message is due, or the timeout ends. No polling loop. Each fetch
  carries a token, kept until its reply is read: a fetch sent again after a lost reply first
  hands back what the lost one took, so nothing stays held by a worker that never saw it.
* ack: one ``HDEL`` of the receipts per queue. Receipts are integers ``seq * 10 + priority``.
* results: ``Consumer.ack(deliveries, results)`` writes the records that ride with the
  deliveries in the acknowledgement's script (``ack_results.lua``: each record a field of its
  bucket's hash, after its expiry, and only for the batches the worker still holds), which then
  announces the batch's ids on ``hurtle:results``; records that ride with no delivery are sent,
  per bucket's hash, as ``results_expire.lua`` (the hash's expiry, set before any record is in
  it) and one ``HSET``, then one ``PUBLISH``, in the same pipeline.
  Waiters do not poll: one listener thread per broker object, on one connection, subscribes to
  that channel and wakes the waiters of the ids it hears; reads of records go through a small
  pool of their own (``RESULT_CONNECTIONS``), so a thousand waiters use a handful of connections.
* limits: ``rate.lua`` (GCRA tokens) and ``slots.lua`` (concurrency slots held per worker),
  one call per key, pipelined; unique locks: ``publish_unique.lua`` takes them and publishes in
  one script per queue, ``unique_release.lua`` ends them. Deferral reuses ``retry.lua``.
* control: ``fetch.lua`` takes nothing from a queue whose ``paused`` key exists, and returns
  whether its ``cancels`` flag exists (``Consumer.cancellations``); ``cancel`` adds ids to the
  ``hurtle:cancelled`` zset (scored by when each ends) and raises every known queue's flag with
  ``cancel_flag.lua``; the worker then reads the batch's ids with one ``ZMSCORE``. It returns
  its ``latest-replaced`` flag too, raised by ``latest_put.lua`` when a debounce record
  replaces another call's (``Consumer.unreplaced``): while it is down, the worker's debounce
  check reads no records (no round trip before a batch runs). ``resume``
  pushes a wake-up token. Dead letters of messages not run are pipelined, one round trip.
* crash recovery: ``heartbeat.lua`` records the worker's deadline per queue (server time plus
  the worker's own ``heartbeat_timeout``; a fetch refreshes it too) and hands back, at the front
  of the queue, what workers whose deadline passed held. It counts their deaths per message: a
  message recovered twice is quarantined and let out alone, and one whose workers keep dying
  becomes a dead letter past ``max_recoveries`` (see the script's header).

Nothing here decodes a payload: garbage bytes come out of ``fetch`` like any message. Bad data
that something else wrote into Redis never stops a queue: a delayed member that is not
``P:SEQ:payload`` goes to the queue's dead letters as it was, and a retry whose message has a
priority outside 0-9 or a non-finite eta dead-letters the delivery as delivered, with the reason
(rather than clamp the priority: the message would run in an order nobody chose).

What runs twice. The clients resend a command once when its connection fails (a pooled
connection that died with a restarted server); timeouts are not resent. So a command whose reply
was lost may run twice, and so may one that the caller tries again after a ``BrokerError``:

* fetch: takes once — the token above;
* heartbeat, close: no harm done twice;
* ack, retry, dead letter, release: once — a delivery is settled one way only, and settling one
  already settled, or recovered from a worker declared dead, changes nothing (the copy that went
  back to the queue is the one that lives);
* publish: at least once — a batch whose reply was lost may be stored twice, and a publish that
  raised may have been stored: calling it again can duplicate messages, never lose them;
* a retry into another queue (another hash tag, so no one script can do it): the new attempt is
  stored first and the delivery settled only once that succeeded, so a failure in between leaves
  the message in both queues (it runs twice), never in neither.
"""

from .broker import BLOCKING_SOCKET_TIMEOUT as BLOCKING_SOCKET_TIMEOUT
from .broker import CONNECT_TIMEOUT as CONNECT_TIMEOUT
from .broker import RESULT_CONNECTIONS as RESULT_CONNECTIONS
from .broker import SOCKET_TIMEOUT as SOCKET_TIMEOUT
from .broker import RedisBroker
from .cluster import RedisClusterBroker, RedisClusterConsumer
from .consumer import MAX_BLOCK as MAX_BLOCK
from .consumer import PROMOTE_LIMIT as PROMOTE_LIMIT
from .consumer import RedisConsumer
from .scripts import _get_scripts as _get_scripts

__all__ = ["RedisBroker", "RedisClusterBroker", "RedisClusterConsumer", "RedisConsumer"]
