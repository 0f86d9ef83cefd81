"""The database and the connections of one broker object: the URL and its options, the schema
(made on first use, its version checked, upgraded on demand), the pool that every operation
borrows a connection from, and the one-line errors a user sees when the server cannot be used.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ...errors import BrokerError, ConfigurationError
from . import sql
from .sql import DEFAULT_SCHEMA, Sql, check_schema_name, tables, upgrade

T = TypeVar("T")

#: Seconds a connection attempt may take before it counts as failed.
CONNECT_TIMEOUT = 5.0
#: Seconds an operation waits for a connection of the pool (the server may be down).
POOL_TIMEOUT = 10.0
#: Most connections one broker object keeps (a worker's fetcher, acker, heartbeat and result
#: readers each borrow one at a time).
POOL_SIZE = 8
#: Times an operation that lost a deadlock is run again before it fails.
DEADLOCK_RETRIES = 5
#: Pools left behind by a fork: kept referenced so that they are never closed from the child,
#: which would end the parent's sessions.
_INHERITED: list[Any] = []


def public_url(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}@{host}").geturl()


def parse_url(url: str) -> tuple[str, str]:
    """``(libpq connection URL, schema)`` from a broker URL: hurtle's own option ``schema`` is
    taken out, libpq's (``sslmode``, ``connect_timeout``, …) stay."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"not a PostgreSQL URL: {public_url(url)!r}; use postgresql://user@host:port/database"
        )
    schema = DEFAULT_SCHEMA
    kept = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "schema":
            schema = check_schema_name(value, public_url(url))
        else:
            kept.append((name, value))
    if not any(name == "connect_timeout" for name, _ in kept):
        kept.append(("connect_timeout", str(int(CONNECT_TIMEOUT))))
    return parts._replace(scheme="postgresql", query=urlencode(kept)).geturl(), schema


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text.removeprefix("connection failed: ") or type(err).__name__


def connection_error(url: str, err: BaseException, doing: str) -> BrokerError | ConfigurationError:
    """The one-line error a user sees for ``err``, with what to check."""
    reason = _first_line(err)
    if isinstance(err, psycopg.ProgrammingError) and "invalid" in reason:
        return ConfigurationError(
            f"bad PostgreSQL URL {url!r}: {reason}; expected "
            "postgresql://user[:password]@host[:port]/database[?schema=hurtle]"
        )
    if "password authentication failed" in reason or ("role" in reason and "not exist" in reason):
        hint = "check the user and password in the broker URL"
    elif "database" in reason and "does not exist" in reason:
        hint = "create the database (createdb), or name an existing one in the broker URL"
    elif "no pg_hba.conf entry" in reason:
        hint = "allow this host and user in the server's pg_hba.conf"
    elif isinstance(err, psycopg_pool.PoolTimeout | psycopg.OperationalError):
        hint = "is the PostgreSQL server running there and accepting TCP/IP connections?"
    else:
        hint = ""
    return BrokerError(
        f"PostgreSQL at {url} failed while {doing}: {reason}" + (f"; {hint}" if hint else "")
    )


def _unreachable(err: psycopg.OperationalError) -> bool:
    """Whether a failed connection says the server is not there (yet): down, restarting,
    refusing connections; not a refusal of these credentials or this database, which waiting
    does not mend."""
    reason = _first_line(err)
    return not (
        "password authentication failed" in reason
        or ("role" in reason and "not exist" in reason)
        or ("database" in reason and "does not exist" in reason)
        or "no pg_hba.conf entry" in reason
    )


class _Connection:
    """What ``PostgresBroker`` is built on: its URL, schema, pool and transactions."""

    url: str
    schema: str
    _given_url: str
    _sql: Sql
    _conninfo: str
    _pool: psycopg_pool.ConnectionPool[Any] | None
    _pid: int
    _closed: bool
    _pool_lock: threading.Lock
    _create: bool
    _unchecked: bool

    def _setup(self, url: str, create: bool) -> None:
        self._given_url = url  # with its password: for the connections of a heartbeat session
        self.url = public_url(url)
        self._conninfo, self.schema = parse_url(url)
        self._sql = Sql(self.schema)
        self._pool = None
        self._pid = os.getpid()
        self._closed = False
        self._pool_lock = threading.Lock()
        self._create = create
        #: Whether the schema is still to be checked: the server did not answer when the
        #: broker was made (a worker started while it restarts), so the first operation that
        #: reaches it checks it, as a Redis broker connects at its first use.
        self._unchecked = False
        try:
            self._check_schema()
        except BrokerError as err:
            if not isinstance(err.__cause__, psycopg.OperationalError) or not _unreachable(
                err.__cause__
            ):
                raise
            self._unchecked = True

    def _check_schema(self) -> None:
        """Make the schema or check its version (``prepare_schema``); ``BrokerError`` when the
        server cannot be used, ``ConfigurationError`` when the schema does not fit."""
        try:
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                prepare_schema(conn, self.schema, self.url, create=self._create)
        except psycopg.Error as err:
            raise connection_error(self.url, err, "opening the broker") from err
        self._unchecked = False

    def connect(self) -> psycopg.Connection[Any]:
        """A connection of its own (not from the pool), in autocommit mode."""
        try:
            return psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as err:
            raise connection_error(self.url, err, "connecting") from err

    def _pool_now(self) -> psycopg_pool.ConnectionPool[Any]:
        if self._closed:
            raise BrokerError(f"the PostgreSQL broker {self.url!r} is closed")
        if self._unchecked:
            self._check_schema()
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._pool_lock:
            if self._pid != os.getpid():  # forked: the parent's connections stay the parent's
                _INHERITED.append(self._pool)
                self._pool = None
                self._pid = os.getpid()
                self._forked()
            if self._pool is None:
                self._pool = psycopg_pool.ConnectionPool(
                    self._conninfo,
                    min_size=1,
                    max_size=POOL_SIZE,
                    kwargs={"autocommit": True},
                    timeout=POOL_TIMEOUT,
                    name=f"hurtle {self.url}",
                    open=True,
                )
            return self._pool

    def _forked(self) -> None:
        """Called in a forked child before its first operation (subclasses reset their own)."""

    def _run(
        self, doing: str, fn: Callable[[psycopg.Cursor[Any]], T], *, transaction: bool = True
    ) -> T:
        """``fn(cursor)`` on a pooled connection, in one transaction unless ``transaction`` is
        False (then each statement commits on its own); run again when it lost a deadlock."""
        pool = self._pool_now()
        for attempt in range(DEADLOCK_RETRIES):
            try:
                with pool.connection() as conn, conn.cursor(binary=True) as cur:
                    if not transaction:
                        return fn(cur)
                    with conn.transaction():
                        return fn(cur)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as err:
                if attempt == DEADLOCK_RETRIES - 1:
                    self._fail(err, doing)
            except (psycopg.Error, psycopg_pool.PoolTimeout) as err:
                self._lost(pool, err)
                self._fail(err, doing)
        raise AssertionError("unreachable")

    def _send(
        self,
        doing: str,
        send: Callable[[psycopg.Cursor[Any]], object],
        read: Callable[[psycopg.Cursor[Any]], T],
    ) -> T:
        """``send(cursor)`` runs its statements in one transaction, pipelined with its
        ``BEGIN`` and ``COMMIT``: one round trip and one commit for them all; then
        ``read(cursor)`` reads what the last statement returned."""
        pool = self._pool_now()
        try:
            with pool.connection() as conn, conn.cursor(binary=True) as cur:
                with conn.pipeline(), conn.transaction():
                    send(cur)
                return read(cur)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as err:
            self._lost(pool, err)
            self._fail(err, doing)

    def _lost(self, pool: psycopg_pool.ConnectionPool[Any], err: BaseException) -> None:
        """After a connection failed (a server restarted, a backend killed), drop the pool's
        other broken connections now: the next operation gets a working one."""
        if isinstance(err, psycopg.OperationalError) and not self._closed:
            with contextlib.suppress(Exception):
                pool.check()

    def _fail(self, err: BaseException, doing: str) -> NoReturn:
        if self._closed:
            raise BrokerError(f"the PostgreSQL broker {self.url!r} is closed") from err
        raise connection_error(self.url, err, doing) from err

    @contextmanager
    def _cursor(self, doing: str) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in autocommit mode, for reads that need no retry."""
        try:
            with self._pool_now().connection() as conn, conn.cursor(binary=True) as cur:
                yield cur
        except (psycopg.Error, psycopg_pool.PoolTimeout) as err:
            if self._pool is not None:
                self._lost(self._pool, err)
            self._fail(err, doing)

    def _close_pool(self) -> None:
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close(timeout=1.0)


# -- the schema ------------------------------------------------------------------------------


def schema_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The version the schema records, or None when there is no such schema (or no record)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".meta',), prepare=False
    ).fetchone()
    if row is None or not row[0]:
        return None
    row = conn.execute(Sql(schema).VERSION, prepare=False).fetchone()
    return None if row is None else int(row[0])


def prepare_schema(conn: psycopg.Connection[Any], schema: str, url: str, *, create: bool) -> None:
    """Check the schema's version; make the schema when it is missing and ``create`` allows.

    A schema older or newer than this hurtle is refused with what to do.
    """
    version = schema_version(conn, schema)
    if version is None:
        if not create:
            raise ConfigurationError(
                f"the database of {url!r} has no hurtle schema {schema!r}, and nothing was "
                "created: a worker or a send creates it (or hurtle db upgrade APP)"
            )
        version = _create(conn, schema, url)
    if version < sql.SCHEMA_VERSION:
        raise ConfigurationError(
            f"the hurtle schema {schema!r} of {url!r} is at version {version}, older than this "
            f"hurtle's ({sql.SCHEMA_VERSION}): run hurtle db upgrade APP (with every worker "
            "stopped)"
        )
    if version > sql.SCHEMA_VERSION:
        raise ConfigurationError(
            f"the hurtle schema {schema!r} of {url!r} is at version {version}, newer than this "
            f"hurtle's ({sql.SCHEMA_VERSION}): upgrade hurtle here to the version that wrote it"
        )


@contextmanager
def _schema_lock(conn: psycopg.Connection[Any], schema: str) -> Iterator[None]:
    """Hold the schema's advisory lock (``conn`` in autocommit mode) around a transaction that
    begins once it is taken. Taken inside the transaction, the lock would leave it the catalog
    lookups of before the wait: a schema made meanwhile by the process it waited for would
    still look missing (to ``to_regclass``), and making it again would fail (``relation "meta"
    already exists``); a transaction begun after the wait sees it."""
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (schema,))
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):  # a lost connection took the lock with it
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (schema,))


def _create(conn: psycopg.Connection[Any], schema: str, url: str) -> int:
    """Make the schema at ``sql.SCHEMA_VERSION``, once however many processes try at once."""
    try:
        with _schema_lock(conn, schema), conn.transaction():
            version = schema_version(conn, schema)
            if version is not None:  # another process made it meanwhile
                return version
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            for statement in tables(schema):
                conn.execute(statement, prepare=False)
            conn.execute(f'INSERT INTO "{schema}".meta (version) VALUES ({sql.SCHEMA_VERSION})')
    except pg_errors.InsufficientPrivilege as err:
        user = conn.info.user
        database = conn.info.dbname
        raise ConfigurationError(
            f"the PostgreSQL user {user!r} may not create the hurtle schema {schema!r} in the "
            f"database {database!r} of {url!r} ({_first_line(err)}): as the database's owner, "
            f'run GRANT CREATE ON DATABASE "{database}" TO "{user}"; (or make the schema once '
            "with hurtle db upgrade APP as a user who may)"
        ) from err
    return sql.SCHEMA_VERSION


def upgrade_schema(url: str) -> tuple[int | None, int]:
    """Bring the schema of ``url`` to ``sql.SCHEMA_VERSION`` (making it if missing), in one
    transaction; returns ``(version before, version now)``. ``hurtle db upgrade`` runs it."""
    conninfo, schema = parse_url(url)
    public = public_url(url)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            before = schema_version(conn, schema)
            if before is None:
                return None, _create(conn, schema, public)
            if before > sql.SCHEMA_VERSION:
                prepare_schema(conn, schema, public, create=False)  # says what to do
            with _schema_lock(conn, schema), conn.transaction():
                version = schema_version(conn, schema) or before
                while version < sql.SCHEMA_VERSION:
                    for statement in upgrade(schema, version):
                        conn.execute(statement, prepare=False)
                    version += 1
                conn.execute(f'UPDATE "{schema}".meta SET version = {version}')
            return before, version
    except KeyError as err:
        raise ConfigurationError(
            f"the hurtle schema {schema!r} of {public!r} is at a version this hurtle cannot "
            f"upgrade from ({err}): drop it and let hurtle make it anew"
        ) from err
    except psycopg.Error as err:
        raise connection_error(public, err, "upgrading the schema") from err
