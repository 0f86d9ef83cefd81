"""``sqlite:///path``: the embedded default — durable, zero setup, several processes on one host.

Durability. One database file in WAL mode. By default every commit is flushed to the disk before it
returns (``synchronous=FULL``): a ``publish`` that returned, an ack, a retry or a dead letter
survives a crash of the process *and* of the machine (a power cut). The URL option
``?synchronous=normal`` skips that flush (``synchronous=NORMAL``): a commit still survives a crash
of the process and the file is never corrupted, but a power cut or kernel crash may lose the last
commits — a returned publish, or an ack (the task then runs again). The flush is paid per
transaction, that is per *batch*: measured with ``benchmarks/sqlite_synchronous.py`` (2 cores, ext4
on a virtual disk), ``full`` costs 7 to 13% of publish and 14 to 23% of fetch+ack throughput in
batches of 1,000 (6 to 10% of ``hurtle demo``), and makes one-message-at-a-time publishing 5x slower
(4,000 to 4,600/s instead of 22,000 to 24,000/s); a disk with a slower flush widens the gap. The
level holds per connection: each process gets what its own URL says. No other ``?option`` is
accepted.

Storage. A log and a cursor per priority, so that the hot path writes each message once and
deletes it once, like a plain insert-then-delete loop:

* ``messages`` — every ready or held message, keyed ``(queue, priority, id)`` (``WITHOUT
  ROWID``: the key *is* the table, no second index). Ids come from the one-row ``seq`` counter,
  one ``UPDATE … RETURNING`` per batch; they strictly increase across processes (writes are
  serialized) and are never reused.
* ``cursors`` — per ``(queue, priority)``, the last id claimed: rows above it are ready, rows at
  or below it that still exist are held by some claim. Fetching moves the cursor; it rewrites
  no message.
* ``claims`` — one row per ``(queue, priority)`` range of ids a fetch took, with the worker that
  took it: a worker holds the surviving rows of its claims' ranges. A claim row whose range is
  empty is dropped when an ack reaches it, and on heartbeat and close. A delivery's receipt packs
  its id and priority (``id * 16 + priority``; the queue is on the ``Delivery``).
* ``delayed`` — messages waiting for their ``eta``, indexed by ``(queue, eta)`` so that a
  far-future backlog never slows a claim. The fetch that finds them due moves them to
  ``messages`` under new ids, in the order they were published.
* ``workers`` — one row per live consumer and its deadline: the time of its last heartbeat plus
  its *own* heartbeat timeout, so that a peer with a shorter timeout never takes what a live
  worker with a longer one holds. Recovery re-queues what workers whose deadline passed held.
* ``dead`` — dead letters, oldest first by row id. Each dead-letter write drops, in its own
  transaction, those of its queue past ``dead_letter_ttl`` and then the oldest beyond
  ``dead_letter_max`` (expiry goes by the order they were recorded). Each row keeps its
  message's id, indexed: ``find_dead`` is one index read, and trims take the index rows along.
* ``queues`` — the names of the queues published to, less those forgotten (``forget``: empty
  ones only). A broker object writes the name of a queue it publishes to once a minute at most
  (``KNOWN_REFRESH``), so a queue another process forgot is known again soon after its next
  message; its ``cursors`` are never dropped.
* ``schedules`` — per ``(queue, name)`` of a periodic task, the last tick claimed, and
  ``schedule_ticks`` the latest ticks claimed (``claim_tick``: the check, the record and the
  publish in one transaction). Made by the first claim, so files of older versions need no
  upgrade.
* ``results`` — task results by message id with their expiry (``Consumer.ack(..., results)``),
  written in the acknowledgement's transaction; each such write first deletes up to 100 expired
  rows (an index seek on ``expires`` that finds nothing, most of the time). Made with ``IF NOT
  EXISTS`` when a file is opened: an additive table that older versions ignore.
* ``paused``, ``cancelled`` — paused queues, and cancelled message ids with the end of each
  cancellation. A claim skips paused queues (and the waiters' probe ignores them) and, when it
  took something, tells its consumer in the same transaction whether any cancellation is live.
  Made with ``IF NOT EXISTS`` when a file is opened, like ``results``.
* ``deaths``, ``quarantine``, ``probes`` — poison messages (a task that kills its process), as in
  the Redis broker (``lua/heartbeat.lua``): recovery counts a death per recovered message (by
  sha1 of its bytes; at most ``MAX_DEATHS`` rows, those with the fewest deaths go first). A
  message recovered for the first time goes back to the queue; one recovered again waits in
  ``quarantine``, away from the innocent messages it keeps coming back with, and recovery lets
  those out one at a time (a *probe*, recorded in ``probes`` until it is settled or recovered;
  the next once the previous was fetched). A message whose dead worker held nothing else, or a
  probe whose dead worker held no other probe (in any queue), was the likely killer: past
  ``max_recoveries`` deaths it becomes a dead letter ("its worker died N times while holding
  it"), with its records and unique lock ended in the same transaction
  (``common.dead_ends``), else it goes (back) to quarantine. Quarantined messages count as ready
  in ``stats``.

Priorities are 0..9 (the task API checks them); a raw ``Message`` outside that range is stored
at the nearest end.

Every operation is one transaction of a few statements per *batch*: publish is one counter
update and one ``executemany`` (a batch of one queue and priority, as ``send_many`` makes: a
multi-row ``INSERT`` per 100 rows, which binds the queue, priority and first id once); fetch reads
each priority of each queue above its cursor, moves the cursor and records the claim; ack is one
``DELETE`` per ``(queue, priority)``, over a range of ids when the acknowledged ids are every id
from one to another (a whole claim of one publisher's batch), else over a JSON array of them.
A solo worker's ``ack_and_fetch`` does its acks and its next claim in one transaction. Writes
start with ``BEGIN IMMEDIATE`` so that two processes never deadlock upgrading a read lock to a
write lock; a busy file is waited for (``busy_timeout``), not reported.

Settling, and what goes back. A receipt names one row; a row whose holder was declared dead was
re-queued under a new id, so a late ack, retry or dead letter of it finds nothing and does
nothing. ``release``, ``close`` and the recovery of a dead worker's deliveries re-insert the
surviving rows under *new* ids: unlike the Redis broker (which puts them back at the front),
released and recovered messages go to the back of their priority, in their original order among
themselves. A retry is the next attempt, published anew (delayed or ready).

Waiting. SQLite cannot notify another process, so a fetch that finds nothing sleep-polls, cheaply:

* publishes, releases, retries and recoveries through the same broker object wake it at once
  (``threading.Condition``);
* commits of other connections (other processes, other broker objects) show in
  ``PRAGMA data_version``, a per-connection counter that costs microseconds and reads no table.
  It is checked after 1 ms, then at intervals doubling up to 25 ms; only when it changed are the
  queues probed (a read: any row above a cursor, the nearest delayed ``eta``), and only when the
  probe sees something ready is the write lock taken;
* the nearest delayed ``eta`` of the consumer's queues ends the wait too.

So an idle worker picks up a message sent from another process within ~25 ms, for about forty
trivial reads a second.

Connections. One connection per broker object, guarded by a lock: a broker and its consumers can
be used from several threads; blocking waits do not hold the lock. A forked child opens its own
connection on first use (a SQLite connection must not cross ``fork``).

Schema. The file records its schema version (``PRAGMA user_version``). A file of the previous
version is upgraded in place (``_UPGRADES``); an older one is refused with a
``ConfigurationError`` (delete or move it).
"""

from .broker import SQLiteBroker
from .connection import DEFAULT_SYNCHRONOUS as DEFAULT_SYNCHRONOUS
from .connection import SYNCHRONOUS_LEVELS as SYNCHRONOUS_LEVELS
from .connection import _path_of as _path_of
from .recovery import MAX_DEATHS as MAX_DEATHS

__all__ = ["SQLiteBroker"]
