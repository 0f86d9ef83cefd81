"""The file and its one connection per broker object: URL options, opening and upgrading the
file, write and read transactions, and the wake-ups of local waiters."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, quote

from ...errors import BrokerError, ConfigurationError
from ...message import message_id
from .schema import _CONTROL_SCHEMA, _RESULTS_SCHEMA, _SCHEMA, _SCHEMA_VERSION, _UPGRADES

#: ``?synchronous=`` levels a SQLite URL may ask for, and the one it gets without asking.
SYNCHRONOUS_LEVELS = ("full", "normal")
DEFAULT_SYNCHRONOUS = "full"
_BUSY_TIMEOUT_MS = 30_000


def _path_of(url: str) -> Path:
    """``sqlite:///rel/x.db`` -> ``rel/x.db``; ``sqlite:////abs/x.db`` -> ``/abs/x.db``."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "sqlite" or not sep:
        raise ConfigurationError(f"not a SQLite URL: {url!r}; use sqlite:///path/to/file.db")
    rest = rest.split("?", 1)[0]
    if not rest.startswith("/") or len(rest) < 2:
        raise ConfigurationError(
            f"bad SQLite URL {url!r}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db (three slashes, then the path)"
        )
    return Path(rest[1:])


def connect_wal(
    target: str | Path,
    synchronous: str,
    prepare: Callable[[sqlite3.Connection], None],
    *,
    uri: bool = False,
    cached_statements: int = 128,
) -> sqlite3.Connection:
    """A connection to ``target`` as the broker and the channels keep theirs: autocommit (the
    transactions are explicit), WAL mode, a 30 s busy timeout, ``PRAGMA synchronous`` at
    ``synchronous`` (``full`` or ``normal``), then ``prepare(conn)`` (the schema). It is closed
    again if any of that fails; the caller says what the file was for in its error."""
    conn = sqlite3.connect(
        target,
        timeout=_BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=cached_statements,
        uri=uri,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
            raise sqlite3.OperationalError("the file cannot be put in WAL mode")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        prepare(conn)
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def immediate(conn: sqlite3.Connection, what: str, url: str) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``conn``: ``BEGIN IMMEDIATE``, ``COMMIT`` once the block is done,
    ``ROLLBACK`` if it raises. A ``sqlite3.Error`` is raised as ``BrokerError`` naming ``what``
    and its ``url``."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as err:
        raise BrokerError(f"{what} {url!r}: {err}") from err


def _synchronous_of(url: str) -> str:
    """The ``PRAGMA synchronous`` level a SQLite URL asks for (``?synchronous=full|normal``).

    The query string holds options only; any other option, or another level, is refused.
    """
    query = url.partition("?")[2]
    level = DEFAULT_SYNCHRONOUS
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "synchronous":
            raise ConfigurationError(
                f"unknown option {name!r} in the SQLite URL {url!r}: the only option is "
                "synchronous (sqlite:///path.db?synchronous=full or normal)"
            )
        level = value.strip().lower()
        if level not in SYNCHRONOUS_LEVELS:
            raise ConfigurationError(
                f"synchronous={value!r} in the SQLite URL {url!r} is not a level hurtle "
                f"offers: use one of {', '.join(SYNCHRONOUS_LEVELS)}"
            )
    return level


def _missing(url: str, path: Path) -> str:
    """Why a SQLite file that must exist (``create=False``) cannot be opened, and what to do."""
    where = str(path.absolute())
    relative = (
        f", relative to the current directory {os.getcwd()!r}" if not path.is_absolute() else ""
    )
    return (
        f"the SQLite broker file {where!r} (from {url!r}{relative}) does not exist, and "
        "nothing was created: run from the directory of your app, or set HURTLE_BROKER_URL "
        "to its file (sqlite:////absolute/path.db); a worker or a send creates it"
    )


class _Connection:
    """What ``SQLiteBroker`` is built on: its file, its connection and their transactions."""

    url: str
    path: Path
    synchronous: str
    #: False: open the file only if it exists (``make_broker(..., create=False)``).
    create: bool
    _lock: threading.Lock
    _wake: threading.Condition
    _ticket: int
    _closed: bool
    _pid: int
    _conn: sqlite3.Connection

    # -- connection and transactions -------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            if not self.path.parent.is_dir():  # a typo must not quietly start an empty queue
                raise FileNotFoundError(f"no directory {str(self.path.parent.absolute())!r}")
            if not self.create and not self.path.exists():
                raise ConfigurationError(_missing(self.url, self.path))
            conn = connect_wal(
                # mode=rw: never create the file, even if it vanished since the check above
                self.path if self.create else f"file:{quote(str(self.path))}?mode=rw",
                self.synchronous,
                self._migrate,
                uri=not self.create,
                cached_statements=256,
            )
        except (OSError, sqlite3.Error) as err:
            raise ConfigurationError(
                f"cannot open the SQLite broker file {str(self.path)!r} (from {self.url!r}): "
                f"{err}; check that the path names a writable file in a writable directory"
            ) from err
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # for upgrades that index what only a decoder knows
        conn.create_function("hurtle_message_id", 1, message_id, deterministic=True)
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"schema version {version} is newer than this hurtle ({_SCHEMA_VERSION})"
                )
            while 0 < version < _SCHEMA_VERSION and version in _UPGRADES:
                for statement in _UPGRADES[version].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                version += 1
                conn.execute(f"PRAGMA user_version = {version}")
            if 0 < version < _SCHEMA_VERSION:
                raise ConfigurationError(
                    f"the SQLite broker file {str(self.path)!r} (from {self.url!r}) was written "
                    f"by an older hurtle (schema version {version}; this one uses "
                    f"{_SCHEMA_VERSION}) and cannot be upgraded: delete it or move it away "
                    "(whatever it still holds is lost to this hurtle), then start again"
                )
            if version < _SCHEMA_VERSION:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            for statement in _RESULTS_SCHEMA + _CONTROL_SCHEMA:
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _connection(self) -> sqlite3.Connection:
        """The connection, reopened in a forked child. Call with ``_lock`` held."""
        if self._closed:
            raise BrokerError(f"the SQLite broker {self.url!r} is closed")
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._conn = self._open()  # never touch the parent's connection
        return self._conn

    def _after_fork_check(self) -> None:
        if self._pid != os.getpid():  # a lock held by another thread at fork time stays held
            self._lock = threading.Lock()
            self._wake = threading.Condition(threading.Lock())

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) on the shared connection."""
        self._after_fork_check()
        with self._lock, immediate(self._connection(), "SQLite broker", self.url) as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot across several statements."""
        self._after_fork_check()
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
            except sqlite3.Error as err:
                raise BrokerError(f"SQLite broker {self.url!r}: {err}") from err

    def _notify(self) -> None:
        with self._wake:
            self._ticket += 1
            self._wake.notify_all()
