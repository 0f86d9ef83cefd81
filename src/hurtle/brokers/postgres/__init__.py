"""``postgresql://user@host/database``: the broker in a PostgreSQL database (psycopg 3).

Storage. Every table lives in one schema of its own (``hurtle`` unless the URL says
``?schema=name``), made on first use and recording its version (``sql.py``):

* ``messages`` — what waits to run or runs now: a row per message, keyed by an id from one
  sequence (so ids grow in publish order), with its queue, priority, body, and the worker that
  holds it (NULL while it waits). Rows are served by an index ``(queue, priority DESC, id)``:
  highest priority first, then oldest. A claim is one ``UPDATE … SET worker`` over the rows a
  ``SELECT … FOR UPDATE SKIP LOCKED … LIMIT n`` picked, so any number of workers claim side by
  side without waiting on each other; an acknowledgement deletes the rows. No index names
  ``worker`` and pages are filled to half, so a claim rewrites each row on its page without
  touching an index (a HOT update: two WAL records a row, as many as a plain ``DELETE …
  SKIP LOCKED`` takes). Finished messages leave the table: it holds the backlog and what is in
  flight, nothing more, and autovacuum is asked to visit it after 1% of it changed.
* ``holders`` — one row per worker that claimed rows (written by the claim, ``ON CONFLICT DO
  NOTHING``): what recovery reads to find the dead workers that may hold rows. Their rows are then
  found by ``worker``, with a scan of ``messages`` (no index names it): once per dead worker, and
  at a worker's ``close``, rather than a write per batch on the hot path. A claim holds its
  worker's advisory lock shared until it commits; recovery takes it alone before it takes a
  worker's rows back, so it never drops the holder row of a claim it cannot see yet.
* ``delayed`` — messages waiting for their ``eta``, indexed by ``(queue, eta)``: the fetch that
  finds them due moves them to ``messages``, in the order they were published.
* ``workers`` — one row per live consumer and its deadline (the server's clock at its last beat
  plus its own timeout). A beat forgets workers past their deadline and takes back what every
  holder without a row holds. Taken back, released and recovered messages go
  back under new ids, at the back of their priority: a late acknowledgement of the old delivery
  finds nothing.
* ``dead`` — dead letters, with their message's id indexed (``find_dead``), trimmed per queue
  by ``dead_letter_ttl`` and ``dead_letter_max`` in the transaction that writes one.
* ``results`` (with their expiry; running tasks' progress reports are rows there too, under
  ``progress:`` and the message id), ``rates``, ``slots``, ``uniques``, ``schedules`` and
  ``schedule_ticks``, ``chords`` and ``chord_members``, ``worker_reports`` and
  ``worker_totals``, ``paused``, ``cancelled``, ``queues``; ``deaths``, ``quarantine`` and
  ``probes`` for messages whose workers keep dying, as on the other brokers.

Every operation is one statement or one transaction per *batch*: publish is one ``INSERT``
over arrays of rows (with the queues' names and the notification in the same statement), a
fetch one transaction sent in one round trip (the due delayed rows, then the claim), an
acknowledgement one ``DELETE``. A solo worker's ``ack_and_fetch`` sends its acknowledgement and
its next claim in the same transaction: one commit per batch.

Waiting. A publish notifies the queues it wrote to (``NOTIFY``, delivered at commit); each
broker object has one listening connection while anyone waits, which wakes its idle consumers
and its result waiters at once. A notification lost with a connection costs at most
``listener.POLL_INTERVAL`` (a second): an idle consumer claims again that often, and when the
nearest delayed message of its queues is due.

Durability is the server's: a publish that returned is committed (with the server's
``synchronous_commit``); a worker killed with SIGKILL loses nothing (its deliveries go back
once its deadline passes); a server that restarts loses nothing committed, and every broker
object reconnects on its next operation (an operation that failed with the connection raised a
``BrokerError``). A fetch whose claim committed while its reply was lost leaves rows in its
worker's name that the worker never got: its consumer's next fetch hands them over
(``consumer.py``); an acknowledgement sent again after a lost reply finds nothing to delete.

Schema versions. A broker object checks the schema's version when it is made: missing, it makes
the schema (or says which grant it needs); older than this hurtle, it says to run ``hurtle db
upgrade APP``; newer, to upgrade hurtle.
"""

from .broker import PostgresBroker
from .connection import upgrade_schema
from .sql import DEFAULT_SCHEMA, SCHEMA_VERSION

__all__ = ["DEFAULT_SCHEMA", "SCHEMA_VERSION", "PostgresBroker", "upgrade_schema"]
