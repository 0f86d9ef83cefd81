"""The outbox table: where a send with ``connection=`` writes its messages when the app's broker
is not in the application's database (Redis, a Redis Cluster, NATS), and the statements the
relay (``relay.py``) reads and deletes them with.

``Hurtle("redis://...", outbox="postgresql://.../db")`` names the database and, with
``?schema=``, the schema (``hurtle`` by default; the URL is parsed as a PostgreSQL broker's,
``connection.parse_url``). The table is ``<schema>.outbox``: a sequence number, then the encoded
messages of one write (its queue, priority, eta and id are in each), up to ``BATCH`` a row, and
how many: a ``send_many`` of a thousand calls is one row, written and deleted once. It is made
on first use, on a connection of its own, once however many processes try at once; it shares
the schema with a PostgreSQL broker's tables if the same schema holds them, without touching
them.

A write (``OutboxTable.write``) runs on the application's connection (``transactions``: psycopg
3 or 2, SQLAlchemy, Django) in its open transaction: one statement per row, its ``INSERT`` and
a ``NOTIFY`` on the outbox's channel (one round trip: the application waits for nothing else),
which PostgreSQL delivers at the commit (never on a rollback), once however many rows notified:
the relay wakes then. A message's id is fixed when it is written, so the handle the
send returns is the message that runs.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from ...errors import ConfigurationError
from ...message import Message, encode_many
from ..base import MAX_SIZE
from .connection import connection_error, parse_url, public_url
from .transactions import cursor_of

#: Most messages a row holds (a write of more is several rows).
BATCH = 1000

_ARRAY_HEAD = struct.Struct("!iiIii")  # dimensions, has nulls, element type, length, lower bound
_LENGTH = struct.Struct("!i").pack
_BYTEA = 17


class _Bodies(bytes):
    """Encoded messages as one ``bytea[]`` in PostgreSQL's binary format, made with one join
    (psycopg's own dumper walks the list in Python, element by element)."""

    @classmethod
    def of(cls, raws: Sequence[bytes]) -> _Bodies:
        parts = [_ARRAY_HEAD.pack(1, 0, _BYTEA, len(raws), 1)]
        for raw in raws:
            parts += (_LENGTH(len(raw)), raw)
        return cls(b"".join(parts))


class _BodiesDumper(Dumper):
    format = Format.BINARY
    oid = 1001  # bytea[]

    def dump(self, obj: Any) -> bytes:
        return obj  # type: ignore[no-any-return]  # a _Bodies: the bytes as they go


def unique_refused(url: str) -> str:
    """Why a ``unique_for`` task cannot be sent through the outbox."""
    return (
        "a task with unique_for cannot be sent with connection= through the outbox "
        f"({url}): its lock lives in the broker and would be taken only when the relay "
        "publishes, after your commit, so the handle returned could name a message that never "
        "runs; send it after the commit instead (Django's transaction.on_commit, or after "
        "session.commit())"
    )


class OutboxTable:
    """One outbox: its database, its schema, its statements; the table made on first use."""

    def __init__(self, url: str) -> None:
        self._conninfo, self.schema = parse_url(url)
        self.url = public_url(url)
        s = f'"{self.schema}"'
        #: The channel a write notifies at its commit, and the relay listens on.
        self.channel = f"{self.schema}.outbox"
        #: The advisory lock the one relay at work holds, on its own connection.
        self.lock_key = f"{self.schema}\noutbox relay"
        #: One row per ``BATCH`` messages of a write at most: a ``send_many`` of 1,000 is one
        #: row to insert, and one for the relay to delete; the notification goes in the same
        #: statement, so a row is one round trip.
        self.INSERT = (
            f"WITH w AS (INSERT INTO {s}.outbox (n, bodies) VALUES (%s, %b::bytea[])) "
            "SELECT pg_notify(%s, '')"
        )
        #: The relay's one statement per batch, in a transaction that commits only once the
        #: batch is published: the oldest rows that start within the first ``%s`` messages
        #: (of at most ``%s`` rows), deleted and returned (a relay that dies before its commit
        #: leaves them in place).
        self.TAKE = (
            f"DELETE FROM {s}.outbox WHERE seq IN (SELECT seq FROM ("
            f"SELECT seq, sum(n) OVER (ORDER BY seq) - n AS before FROM ("
            f"SELECT seq, n FROM {s}.outbox ORDER BY seq LIMIT %s) AS oldest) AS w "
            "WHERE before < %s) RETURNING seq, bodies"
        )
        self.SELECT = f"SELECT seq, bodies FROM {s}.outbox ORDER BY seq LIMIT %s"
        #: How many messages wait.
        self.COUNT = f"SELECT coalesce(sum(n), 0) FROM {s}.outbox"
        #: Where the relay puts a message its broker cannot store (larger than the broker's
        #: ``max_message_size``: NATS's ``max_payload`` is 1 MiB by default), in the
        #: transaction that deletes its row: kept with the reason, for a user to find
        #: (``hurtle outbox count``), never published, never blocking the messages after it.
        self.BURY = (
            f"INSERT INTO {s}.outbox_dead (id, queue, reason, body) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %b::bytea[])"
        )
        self.DEAD = f"SELECT id, queue, reason, at FROM {s}.outbox_dead ORDER BY at, id LIMIT %s"
        self.DEAD_COUNT = f"SELECT count(*) FROM {s}.outbox_dead"
        self._create = [
            f"CREATE SCHEMA IF NOT EXISTS {s}",
            f"CREATE TABLE IF NOT EXISTS {s}.outbox ("
            "seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, n integer NOT NULL, "
            "bodies bytea[] NOT NULL) WITH (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_insert_scale_factor = 0.01)",
            f"CREATE TABLE IF NOT EXISTS {s}.outbox_dead (id text NOT NULL, queue text NOT NULL, "
            "reason text NOT NULL, body bytea NOT NULL, at timestamptz NOT NULL DEFAULT now())",
        ]
        #: How a write's messages are stored (``_prepare`` picks one by the server): compressed
        #: with lz4, which shrinks a row's bytes (and so the write-ahead log the commit waits
        #: for, and the pieces TOAST stores and deletes) several times over at a fraction of a
        #: millisecond per row; out of line as they are where lz4 is missing (PostgreSQL 13, or a
        #: server built without it), as pglz would cost more than it saves.
        self._storage = {
            True: f"ALTER TABLE {s}.outbox ALTER COLUMN bodies SET STORAGE EXTENDED, "
            "ALTER COLUMN bodies SET COMPRESSION lz4",
            False: f"ALTER TABLE {s}.outbox ALTER COLUMN bodies SET STORAGE EXTERNAL",
        }
        self._ready = False
        self._lock = threading.Lock()

    def connect(self) -> psycopg.Connection[Any]:
        """A connection of its own to the outbox's database, in autocommit mode; the table made
        if missing. ``BrokerError`` (one line) when the server cannot be used."""
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as err:
            raise connection_error(self.url, err, "connecting to the outbox") from err
        try:
            self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def prepare(self) -> None:
        """Make the schema and the table once per object (the first write's cost)."""
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                self.connect().close()

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        if self._ready:
            return
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (self.lock_key,)
                )
                for statement in self._create:
                    conn.execute(statement, prepare=False)
                lz4 = conn.execute(
                    "SELECT count(*) FROM pg_settings WHERE name = 'default_toast_compression' "
                    "AND 'lz4' = ANY(enumvals)"
                ).fetchone()
                conn.execute(self._storage[bool(lz4 and lz4[0])], prepare=False)
        except psycopg.errors.InsufficientPrivilege as err:
            raise ConfigurationError(
                f"the PostgreSQL user {conn.info.user!r} may not make the outbox table "
                f"{self.schema}.outbox in {self.url}: {' '.join(str(err).split())}; make it "
                "once as a user who may (hurtle outbox relay APP does), or grant CREATE"
            ) from err
        except psycopg.Error as err:
            raise connection_error(self.url, err, "making the outbox table") from err
        self._ready = True

    def write(self, connection: object, messages: Sequence[Message]) -> list[str]:
        """Write ``messages`` with the application's ``connection``, in its open transaction,
        and notify the relay at the commit; their ids."""
        self.prepare()
        raws = encode_many(list(messages), MAX_SIZE)
        with cursor_of(connection, self.url, f"writing {len(raws)} messages to the outbox") as cur:
            # psycopg2, and a cursor that binds on the client (Django's), take the list
            whole = False
            if isinstance(cur, psycopg.Cursor) and not isinstance(cur, psycopg.ClientCursor):
                cur.adapters.register_dumper(_Bodies, _BodiesDumper)  # this cursor's alone
                whole = True
            for at in range(0, len(raws), BATCH):
                part = raws[at : at + BATCH]
                body = _Bodies.of(part) if whole else part
                cur.execute(self.INSERT, (len(part), body, self.channel))
        return [m.id for m in messages]
