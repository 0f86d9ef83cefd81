"""Writing messages in the application's own transaction (``send(connection=...)``): the
connection the application gives, unwrapped to the driver's, and a cursor on it that
``publishing.store`` writes with.

What can be given: a psycopg 3 ``Connection``; a psycopg2 connection; a SQLAlchemy
``Connection``, ``Session`` or ``scoped_session`` on either driver (the session's connection,
which begins the session's transaction if it had none); Django's ``connection`` (or
``connections["name"]``) to PostgreSQL. They are told apart by their types' modules, so that
neither SQLAlchemy nor Django is imported here.

Nothing is committed or rolled back here: the application's transaction decides. A connection
in autocommit mode outside a transaction (Django outside ``atomic``) commits the write at once,
as a plain send would.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from ...errors import BrokerError, ConfigurationError

TAKEN = (
    "connection= takes a psycopg connection, a SQLAlchemy Connection or Session, or Django's "
    "connection (django.db.connection)"
)


class Statements(Protocol):
    """What ``publishing.store`` and ``take_locks`` write with: a psycopg cursor, or the
    psycopg2 one below."""

    def execute(self, query: Any, params: Sequence[Any] = ...) -> Statements: ...

    def fetchone(self) -> Any: ...


def driver_connection(connection: object) -> Any:
    """The psycopg (3 or 2) connection under ``connection``; ``ConfigurationError`` for
    anything else, saying what is taken."""
    if isinstance(connection, psycopg.Connection):
        return connection
    kind = type(connection)
    module = kind.__module__
    if isinstance(connection, psycopg.AsyncConnection) or "Async" in kind.__name__:
        raise ConfigurationError(
            f"connection= got an asynchronous connection ({kind.__name__}): sends are "
            "synchronous; give a synchronous one (psycopg.Connection, a SQLAlchemy Session "
            "or Connection on a synchronous engine)"
        )
    if module.startswith("sqlalchemy."):
        return _sqlalchemy(connection)
    if module.startswith("django."):
        return _django(connection)
    if module.startswith("psycopg2"):
        return connection
    raise ConfigurationError(f"{TAKEN}; got {kind.__module__}.{kind.__qualname__}")


def _sqlalchemy(connection: Any) -> Any:
    if callable(getattr(connection, "connection", None)):  # a Session, or a scoped_session
        connection = connection.connection()  # begins the session's transaction if none
    elif not connection.in_transaction():
        # a Connection outside a transaction: begun here, so that its commit() commits what
        # is written below (the driver's implicit transaction is not one SQLAlchemy knows of)
        connection.begin()
    if connection.dialect.name != "postgresql":
        raise ConfigurationError(
            f"connection= must be a connection to the broker's PostgreSQL database; this "
            f"SQLAlchemy connection is to {connection.dialect.name}"
        )
    fairy = connection.connection
    return getattr(fairy, "driver_connection", None) or fairy.dbapi_connection


def _django(connection: Any) -> Any:
    if getattr(connection, "vendor", None) != "postgresql":
        raise ConfigurationError(
            f"connection= must be a connection to the broker's PostgreSQL database; this "
            f"Django connection ({getattr(connection, 'alias', '?')!r}) is to "
            f"{getattr(connection, 'vendor', type(connection).__name__)}"
        )
    connection.ensure_connection()
    return connection.connection


class _Psycopg2Cursor:
    """A psycopg2 cursor that takes the statements written for psycopg 3: ``%b`` (a binary
    parameter) is ``%s`` there, and ``execute`` returns the cursor."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor

    def execute(self, query: Any, params: Sequence[Any] = ()) -> _Psycopg2Cursor:
        self.cursor.execute(query.replace("%b", "%s"), params)
        return self

    def fetchone(self) -> Any:
        return self.cursor.fetchone()


@contextmanager
def cursor_of(connection: object, url: str, doing: str) -> Iterator[Statements]:
    """A cursor on the driver connection under ``connection``, in its open transaction; the
    driver's errors become one ``BrokerError`` line (``ConfigurationError`` for a connection
    to another database than the broker's)."""
    raw = driver_connection(connection)
    if isinstance(raw, psycopg.Connection):
        if raw.closed:
            raise ConfigurationError("connection= got a closed psycopg connection")
        if raw.info.transaction_status == TransactionStatus.INERROR:
            raise BrokerError(
                f"cannot go on {doing}: the connection's transaction has already failed; "
                "roll it back first"
            )
        try:
            with raw.cursor(row_factory=tuple_row) as cur:
                yield cur
        except psycopg.Error as err:
            raise _error(err, url, doing) from err
        return
    driver_error = importlib.import_module("psycopg2").Error  # given only by who has it
    if raw.closed:
        raise ConfigurationError("connection= got a closed psycopg2 connection")
    try:
        with raw.cursor() as cur:
            yield _Psycopg2Cursor(cur)
    except driver_error as err:
        raise _error(err, url, doing) from err


def _error(err: Exception, url: str, doing: str) -> Exception:
    reason = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, pg_errors.UndefinedTable) or getattr(err, "pgcode", None) == "42P01":
        return ConfigurationError(
            f"connection= must be a connection to the broker's database ({url}), with its hurtle "
            f"schema: {reason}"
        )
    return BrokerError(
        f"{doing} with the connection given failed: {reason}; its transaction is aborted: roll "
        "it back"
    )
