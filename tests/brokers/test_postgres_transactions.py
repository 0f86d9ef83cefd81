"""Sends written in the application's own transaction (``options(connection=...)``) on the
PostgreSQL broker: a rolled-back send never runs, a committed one runs and wakes the waiting
workers, a client killed before its commit sends nothing; with psycopg 3, psycopg2, SQLAlchemy
and Django, and on every way of sending (``send``, ``send_many``, ``apply_async``,
``send_task``, workflows, unique tasks).

"Never runs" is shown without waiting for anything to happen: a worker in burst mode runs all
that is committed and returns, and a plain send made after the rolled-back one (the sentinel)
shows that it did run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import run_django_client
from hurtle import Hurtle, chain, chord, graph, group
from hurtle.brokers.postgres import PostgresBroker
from hurtle.errors import BrokerError, ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


class Shop:
    """An app on the broker, with a task that records its calls, and the database URL an
    application's own connections use (the broker's, without hurtle's ``schema`` option)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.database = url.partition("?")[0]
        self.schema = url.rpartition("schema=")[2]
        self.app = Hurtle(url)
        self.ran: list[tuple[Any, ...]] = []

        @self.app.task(name="shop.add", store_result=True)
        def add(x: int, y: int) -> int:
            self.ran.append((x, y))
            return x + y

        @self.app.task(name="shop.once", unique_for=3600)
        def once(key: str) -> None:
            self.ran.append(("once", key))

        @self.app.task(name="shop.total")
        def total(results: list[int]) -> None:
            self.ran.append(("total", sum(results)))

        self.add = add
        self.once = once
        self.total = total
        with psycopg.connect(self.database, autocommit=True) as conn:
            conn.execute(f'CREATE TABLE IF NOT EXISTS "{self.schema}_orders" (id int PRIMARY KEY)')  # type: ignore[arg-type]
        self.orders = f'"{self.schema}_orders"'

    def run_all(self) -> list[tuple[Any, ...]]:
        """Run every committed message (a burst worker); what ran, in order."""
        self.ran.clear()
        self.app.worker(burst=True).run()
        return list(self.ran)

    def order_ids(self) -> list[int]:
        with psycopg.connect(self.database) as conn:
            return [r[0] for r in conn.execute(f"SELECT id FROM {self.orders} ORDER BY id")]  # type: ignore[arg-type]


@pytest.fixture
def shop(postgres_url: str) -> Iterator[Shop]:
    s = Shop(postgres_url)
    yield s
    s.app.close()


# -- psycopg 3 -------------------------------------------------------------------------------


def test_a_send_rolled_back_with_its_transaction_never_runs(shop: Shop) -> None:
    with psycopg.connect(shop.database) as conn:
        conn.execute(f"INSERT INTO {shop.orders} VALUES (1)")  # type: ignore[arg-type]
        shop.add.options(connection=conn).send(1, 1)
        shop.add.options(connection=conn).send_many([(2, 2), (3, 3)])
        conn.rollback()
    shop.add.send(0, 0)  # the sentinel
    assert shop.run_all() == [(0, 0)]
    assert shop.order_ids() == []


def test_a_send_committed_with_its_transaction_runs_and_is_not_seen_before(shop: Shop) -> None:
    with psycopg.connect(shop.database) as conn:
        conn.execute(f"INSERT INTO {shop.orders} VALUES (1)")  # type: ignore[arg-type]
        h = shop.add.options(connection=conn, priority=5).send(1, 1)
        shop.add.options(connection=conn).send_many([(2, 2), (3, 3)])
        assert shop.run_all() == []  # written, not committed: no worker sees it
        conn.commit()
    assert sorted(shop.run_all()) == [(1, 1), (2, 2), (3, 3)]
    assert h.result(timeout=10) == 2
    assert shop.order_ids() == [1]


def test_the_commit_notifies_the_queue_and_wakes_a_waiting_worker(shop: Shop) -> None:
    with psycopg.connect(shop.database, autocommit=True) as listen:
        listen.execute(f'LISTEN "{shop.schema}.ready"')  # type: ignore[arg-type]
        heard: list[str] = []
        listen.add_notify_handler(lambda n: heard.append(n.payload))
        worker = shop.app.worker()
        thread = worker.run_in_thread()
        try:
            with psycopg.connect(shop.database) as conn:
                h = shop.add.options(connection=conn).send(20, 22)
                listen.execute("SELECT 1")  # any notification sent so far is read now
                assert heard == []  # nothing before the commit
                conn.commit()
            deadline = time.monotonic() + 30
            while not heard:  # delivered at the commit; read with the next statement
                assert time.monotonic() < deadline, "the commit notified nothing"
                listen.execute("SELECT 1")
                time.sleep(0.01)
            assert heard == ["default"]
            assert h.result(timeout=30) == 42
        finally:
            worker.stop()
            thread.join(30)


def test_a_send_in_an_autocommit_connection_outside_a_transaction_commits_at_once(
    shop: Shop,
) -> None:
    with psycopg.connect(shop.database, autocommit=True) as conn:
        shop.add.options(connection=conn).send(1, 2)
        with conn.transaction():
            shop.add.options(connection=conn).send(3, 4)
            conn.execute("SELECT 1")
        with pytest.raises(ZeroDivisionError), conn.transaction():
            shop.add.options(connection=conn).send(5, 6)
            1 / 0  # noqa: B018 - the block fails: its transaction rolls back
    assert shop.run_all() == [(1, 2), (3, 4)]


def test_every_way_of_sending_takes_the_connection(shop: Shop) -> None:
    def send_all(conn: psycopg.Connection[Any], base: int) -> None:
        add, total = shop.add, shop.total
        add.apply_async((base, 1), connection=conn)
        add.s(base, 2).send(connection=conn)
        add.s(base, 3).apply_async(connection=conn)
        shop.app.send_task("shop.add", args=(base, 4), connection=conn)
        shop.app.send_task("shop.elsewhere", args=(base, 5), connection=conn, queue="other")
        chain(add.s(base, 6), add.s(0)).send(connection=conn)
        group(add.s(base, 7), add.s(base, 8)).send(connection=conn)
        chain(add.s(base, 9), add.s(1)).apply_async(connection=conn)
        group(add.s(base, 10)).apply_async(connection=conn)
        chord([add.s(base, 11), add.s(base, 12)], total.s()).apply_async(connection=conn)
        chain(add.s(base, 13), group(add.s(1), add.s(2)), total.s()).send(connection=conn)
        graph({"b": ["a"]}, a=add.s(base, 14), b=add.s(3)).send(connection=conn)
        shop.once.options(connection=conn).send(f"k{base}")

    with psycopg.connect(shop.database) as conn:
        send_all(conn, 100)
        conn.rollback()
    with psycopg.connect(shop.database) as conn:
        send_all(conn, 200)
        conn.commit()
    ran = shop.run_all()
    expected = [
        (200, 1),
        (200, 2),
        (200, 3),
        (200, 4),
        (200, 6),
        (200, 7),
        (200, 8),
        (200, 9),
        (200, 10),
        (200, 11),
        (200, 12),
        (206, 0),
        (209, 1),
        ("total", 211 + 212),
        (200, 13),
        (213, 1),
        (213, 2),
        ("total", 214 + 215),
        (200, 14),
        (214, 3),
    ]
    assert sorted((r for r in ran if r[0] != "once"), key=repr) == sorted(expected, key=repr)
    assert [r for r in ran if r[0] == "once"] == [("once", "k200")]
    # the other service's task waits on its own queue, and the rolled-back one is not there
    assert shop.app.broker.stats(["other"])["other"].ready == 1


def test_a_unique_lock_taken_in_a_rolled_back_transaction_is_not_held(shop: Shop) -> None:
    with psycopg.connect(shop.database) as conn:
        first = shop.once.options(connection=conn).send("k")
        conn.rollback()
    second = shop.once.send("k")  # the lock was never taken: this one is enqueued
    assert second.id != first.id
    with psycopg.connect(shop.database) as conn:
        third = shop.once.options(connection=conn).send("k")
        conn.commit()
    assert third.id == second.id  # held by the one enqueued
    assert shop.run_all() == [("once", "k")]


def test_a_client_killed_between_the_write_and_the_commit_sends_nothing(
    shop: Shop, tmp_path: Path
) -> None:
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            import psycopg
            from hurtle import Hurtle

            app = Hurtle({shop.url!r})

            @app.task(name="shop.add")
            def add(x, y):
                return x + y

            conn = psycopg.connect({shop.database!r})
            conn.execute({f"INSERT INTO {shop.orders} VALUES (7)"!r})
            add.options(connection=conn).send(7, 7)
            print(conn.info.backend_pid, flush=True)
            sys.stdin.read()  # until killed: the transaction stays open
            """
        )
    )
    with subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    ) as client:
        try:
            assert client.stdout is not None
            line = client.stdout.readline()
            assert line.strip().isdigit(), f"the client did not get to its write: {line!r}"
            backend = int(line)
            assert shop.run_all() == []  # written, not committed
            client.send_signal(signal.SIGKILL)
            assert client.wait(30) == -signal.SIGKILL
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(30)
    _wait_gone(shop.database, backend)  # the server ended the session: its transaction too
    shop.add.send(0, 0)
    assert shop.run_all() == [(0, 0)]
    assert shop.order_ids() == []
    assert shop.app.broker.stats(["default"])["default"].ready == 0


def _wait_gone(database: str, backend: int) -> None:
    """Until the server has no session ``backend`` (it notices a client gone at once on a
    local socket; the bound is only for a server that hangs)."""
    deadline = time.monotonic() + 60
    with psycopg.connect(database, autocommit=True) as conn:
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, f"session {backend} outlived its client"
            time.sleep(0.05)


# -- refusals --------------------------------------------------------------------------------


def test_another_broker_refuses_a_connection_naming_the_outbox() -> None:
    app = Hurtle("memory://")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(ConfigurationError, match=r"the PostgreSQL broker .* with outbox="):
        add.options(connection=object()).send(1, 2)
    with pytest.raises(ConfigurationError, match="outbox="):
        add.apply_async((1, 2), connection=object())
    assert app.broker.stats(["default"])["default"].ready == 0


def test_a_redis_broker_without_an_outbox_names_the_outbox_option(redis_url: str) -> None:
    app = Hurtle(redis_url)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(ConfigurationError, match=r"give the app an outbox.* outbox='postgresql"):
        add.options(connection=object()).send(1, 2)
    assert app.broker.stats(["default"])["default"].ready == 0
    app.close()


def test_eager_mode_runs_a_send_with_a_connection_at_the_send() -> None:
    from hurtle.testing import eager

    app = Hurtle("memory://")
    ran: list[int] = []

    @app.task
    def note(x: int) -> None:
        ran.append(x)

    with eager(app):
        note.options(connection=object()).send(1)
        note.options(connection=object()).send_many([(2,), (3,)])
    assert ran == [1, 2, 3]


def test_what_is_not_a_connection_is_refused_saying_what_is_taken(shop: Shop) -> None:
    with pytest.raises(ConfigurationError, match=r"takes a psycopg connection, a SQLAlchemy"):
        shop.add.options(connection="postgresql://localhost/shop").send(1, 2)


def test_a_signature_does_not_keep_a_connection(shop: Shop) -> None:
    with psycopg.connect(shop.database) as conn:
        with pytest.raises(ConfigurationError, match="does not keep a connection"):
            shop.add.options(connection=conn).s(1, 2)
        with pytest.raises(ConfigurationError, match="does not keep a connection"):
            shop.add.s(1, 2).set(connection=conn)
        with pytest.raises(ConfigurationError, match="does not keep a connection"):
            shop.add.signature((1, 2), connection=conn)


def test_a_connection_to_another_database_is_refused_naming_the_broker_s(
    shop: Shop, postgres_server_url: str
) -> None:
    refused = pytest.raises(ConfigurationError, match=r"connection to the broker's database")
    with psycopg.connect(postgres_server_url) as conn, refused:  # the server's own database
        shop.add.options(connection=conn).send(1, 2)


def test_a_failed_transaction_is_one_broker_error_saying_to_roll_back(shop: Shop) -> None:
    with psycopg.connect(shop.database) as conn:
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT 1/0")
        with pytest.raises(BrokerError, match="already failed; roll it back"):
            shop.add.options(connection=conn).send(1, 2)
        conn.rollback()
        shop.add.options(connection=conn).send(1, 2)
        conn.commit()
    assert shop.run_all() == [(1, 2)]


# -- psycopg2, SQLAlchemy, Django ------------------------------------------------------------


def test_a_psycopg2_connection_writes_in_its_transaction(shop: Shop) -> None:
    psycopg2 = pytest.importorskip("psycopg2")
    conn = psycopg2.connect(shop.database)
    try:
        shop.add.options(connection=conn).send_many([(1, 1), (2, 2)])
        shop.once.options(connection=conn).send("p2")
        conn.rollback()
        shop.add.options(connection=conn, delay=0.0).send(3, 3)
        shop.once.options(connection=conn).send("p2")
        conn.commit()
    finally:
        conn.close()
    assert shop.run_all() == [(3, 3), ("once", "p2")]


def test_a_sqlalchemy_session_and_connection_write_in_their_transaction(shop: Shop) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(
        shop.database.replace("postgresql://", "postgresql+psycopg://")
    )
    insert = sqlalchemy.text(f"INSERT INTO {shop.orders} VALUES (:id)")
    try:
        with Session(engine) as session:
            session.execute(insert, {"id": 1})
            shop.add.options(connection=session).send(1, 1)
            session.rollback()
        with Session(engine) as session:
            shop.add.options(connection=session).send(2, 2)  # the send begins its transaction
            session.execute(insert, {"id": 2})
            session.commit()
        with engine.connect() as conn:  # no transaction yet: the send begins one
            shop.add.options(connection=conn).send(3, 3)
            conn.commit()
        with engine.connect() as conn:
            shop.add.options(connection=conn).send(4, 4)
            conn.rollback()
        with engine.begin() as conn:
            conn.execute(insert, {"id": 5})
            shop.add.options(connection=conn).send(5, 5)
    finally:
        engine.dispose()
    assert shop.run_all() == [(2, 2), (3, 3), (5, 5)]
    assert shop.order_ids() == [2, 5]


def test_a_sqlalchemy_session_on_psycopg2_writes_in_its_transaction(shop: Shop) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pytest.importorskip("psycopg2")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(
        shop.database.replace("postgresql://", "postgresql+psycopg2://")
    )
    try:
        with Session(engine) as session:
            shop.add.options(connection=session).send(1, 1)
            session.rollback()
        with Session(engine) as session:
            shop.add.options(connection=session).send(2, 2)
            session.commit()
    finally:
        engine.dispose()
    assert shop.run_all() == [(2, 2)]


def test_django_s_connection_writes_in_the_atomic_block(shop: Shop, tmp_path: Path) -> None:
    """Django's settings are configured once per process: the project runs in one of its own."""
    pytest.importorskip("django")
    printed = run_django_client(
        tmp_path,
        shop.database,
        f"""
            app = Hurtle({shop.url!r})

            @app.task(name="shop.add")
            def add(x, y):
                return x + y

            class Undo(Exception):
                pass

            try:
                with transaction.atomic():
                    with connection.cursor() as cur:
                        cur.execute({f"INSERT INTO {shop.orders} VALUES (1)"!r})
                    add.options(connection=connection).send(1, 1)
                    raise Undo
            except Undo:
                pass
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute({f"INSERT INTO {shop.orders} VALUES (2)"!r})
                add.options(connection=connection).send(2, 2)
                with transaction.atomic():  # a savepoint, rolled back with its send
                    add.options(connection=connection).send(3, 3)
                    transaction.set_rollback(True)
            print("done", flush=True)
            """,
    )
    assert printed.strip() == "done"
    assert shop.run_all() == [(2, 2)]
    assert shop.order_ids() == [2]


def test_the_broker_writes_with_the_connection_not_its_own(shop: Shop) -> None:
    """The write is on the connection given: its own session sees the row before the commit,
    and the broker's pool does not."""
    broker = shop.app.broker
    assert isinstance(broker, PostgresBroker)
    with psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn).send(1, 1)
        mine = conn.execute(
            f'SELECT count(*) FROM "{shop.schema}".messages'  # type: ignore[arg-type]
        ).fetchone()
        assert mine == (1,)
        assert broker.stats(["default"])["default"].ready == 0
        conn.rollback()
