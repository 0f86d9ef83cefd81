"""What only the PostgreSQL broker has: its schema (made on first use, versions checked, upgraded
by ``hurtle db upgrade``), its one-line errors for a server it cannot use, its notifications
lost with a connection, and a server that crashes and restarts under it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import free_port
from hurtle import Hurtle
from hurtle.brokers import make_broker
from hurtle.brokers.postgres import PostgresBroker, sql
from hurtle.cli import main
from hurtle.errors import BrokerError, ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message
from postgres_server import PostgresServer


def msg(queue: str = "q") -> Message:
    return Message(id=new_id(), task="tests.add", queue=queue)


def schema_of(url: str) -> str:
    return url.rpartition("schema=")[2]


def execute(url: str, statement: str) -> None:
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


@pytest.fixture
def broker(postgres_url: str) -> Iterator[PostgresBroker]:
    b = make_broker(postgres_url)
    assert isinstance(b, PostgresBroker)
    yield b
    b.close()


# -- the schema ------------------------------------------------------------------------------


def test_the_schema_is_made_on_first_use_in_the_schema_the_url_names(postgres_url: str) -> None:
    schema = schema_of(postgres_url)
    make_broker(postgres_url).close()
    with psycopg.connect(postgres_url.partition("?")[0]) as conn:
        row = conn.execute(f'SELECT version FROM "{schema}".meta').fetchone()  # type: ignore[arg-type]
    assert row == (sql.SCHEMA_VERSION,)


def test_processes_that_open_a_new_schema_at_once_make_it_once_and_all_open(
    postgres_url: str,
) -> None:
    """Workers started together on a database without the schema: each opens its broker. One
    makes the schema; those that waited for it on the lock see it made (the catalog lookups of
    their transaction are not the ones from before the wait: they failed with ``relation "meta"
    already exists``). Five new schemas, eight brokers at once on each."""
    errors: list[Exception] = []

    def open_one(url: str, start: threading.Barrier) -> None:
        start.wait()
        try:
            make_broker(url).close()
        except Exception as err:
            errors.append(err)

    for round_ in range(5):
        url = f"{postgres_url}_{round_}"
        start = threading.Barrier(8)
        threads = [threading.Thread(target=open_one, args=(url, start)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        with psycopg.connect(url.partition("?")[0]) as conn:
            rows = conn.execute(f'SELECT version FROM "{schema_of(url)}".meta').fetchall()  # type: ignore[arg-type]
        assert rows == [(sql.SCHEMA_VERSION,)]


def test_a_reader_does_not_make_the_schema_and_says_what_does(postgres_url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"has no hurtle schema .* a worker or a send"):
        make_broker(postgres_url, create=False)


def test_a_bad_schema_name_is_refused_naming_it(postgres_database: str) -> None:
    with pytest.raises(ConfigurationError, match="schema='Bad-Name'"):
        make_broker(f"{postgres_database}?schema=Bad-Name")


def test_a_newer_schema_is_refused_with_what_to_do(postgres_url: str) -> None:
    make_broker(postgres_url).close()
    execute(postgres_url, f'UPDATE "{schema_of(postgres_url)}".meta SET version = 99')
    with pytest.raises(ConfigurationError, match="version 99, newer than this hurtle's"):
        make_broker(postgres_url)


def test_an_older_schema_stops_a_worker_until_hurtle_db_upgrade_brings_it_up(
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_broker(postgres_url).close()  # version 1; this "hurtle" has a version 2
    schema = schema_of(postgres_url)
    monkeypatch.setattr(sql, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(sql.UPGRADES, 1, "ALTER TABLE {s}.queues ADD COLUMN note text")
    (tmp_path / "pgapp.py").write_text(
        f"from hurtle import Hurtle\napp = Hurtle({postgres_url!r})\n"
        "@app.task\ndef add(x, y):\n    return x + y\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["worker", "pgapp:app", "--burst"]) == 2
    err = capsys.readouterr().err
    assert "at version 1, older than this hurtle's (2): run hurtle db upgrade APP" in err
    assert main(["db", "upgrade", "pgapp:app"]) == 0
    assert "from version 1 to 2" in capsys.readouterr().out
    execute(postgres_url, f'SELECT note FROM "{schema}".queues')  # the upgrade ran
    make_broker(postgres_url).close()  # and the broker takes the schema now
    assert main(["db", "upgrade", "pgapp:app"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_hurtle_db_upgrade_makes_a_missing_schema(
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "pgapp2.py").write_text(
        f"from hurtle import Hurtle\napp = Hurtle({postgres_url!r})\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["db", "upgrade", "pgapp2:app"]) == 0
    assert f"made the hurtle schema {schema_of(postgres_url)!r}" in capsys.readouterr().out
    make_broker(postgres_url, create=False).close()


def test_a_user_who_may_not_create_the_schema_is_told_the_grant(postgres_url: str) -> None:
    role = f"hurtle_nocreate_{free_port()}"
    execute(postgres_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        url = postgres_url.replace("postgres@", f"{role}@", 1)
        with pytest.raises(ConfigurationError) as caught:
            make_broker(url)
        text = str(caught.value)
        assert f"the PostgreSQL user {role!r} may not create the hurtle schema" in text
        assert (
            f'GRANT CREATE ON DATABASE "{postgres_url.rpartition("/")[2].partition("?")[0]}"'
            in text
        )
        assert "\n" not in text
    finally:
        execute(postgres_url, f'DROP ROLE "{role}"')


# -- a server that cannot be used --------------------------------------------------------------


def test_a_server_that_is_down_is_one_broker_error_line_with_a_hint() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(BrokerError) as caught:
        make_broker(url)
    text = str(caught.value)
    assert "\n" not in text and "Connection refused" in text
    assert "is the PostgreSQL server running there" in text


def test_an_unknown_user_and_a_wrong_password_name_what_to_check(postgres_database: str) -> None:
    url = postgres_database.replace("postgres@", "no_such_user:secret@", 1)
    with pytest.raises(BrokerError) as caught:
        make_broker(url)
    text = str(caught.value)
    assert 'role "no_such_user" does not exist' in text
    assert "check the user and password" in text and "secret" not in text


def test_an_unknown_database_says_to_create_it(postgres_server_url: str) -> None:
    url = postgres_server_url.rsplit("/", 1)[0] + "/no_such_database_here"
    with pytest.raises(BrokerError, match="create the database"):
        make_broker(url)


def test_an_unknown_url_option_is_a_configuration_error(postgres_database: str) -> None:
    with pytest.raises(ConfigurationError, match=r"bad PostgreSQL URL .*invalid"):
        make_broker(f"{postgres_database}?no_such_option=1")


# -- notifications -----------------------------------------------------------------------------


def test_a_waiting_fetch_outlives_its_listening_connection(broker: PostgresBroker) -> None:
    """The listening connection is killed while a consumer waits: it listens again, and the
    message published meanwhile is fetched (at the latest one poll interval later)."""
    c = broker.consumer(["q"])
    got: list[object] = []
    fetcher = threading.Thread(target=lambda: got.append(c.fetch(10, 20)))
    fetcher.start()
    deadline = time.monotonic() + 10
    with psycopg.connect(broker._conninfo, autocommit=True) as admin:
        while True:  # the listener's backend, once it listens
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' "
                "AND datname = current_database()"
            ).fetchone()
            if row is not None:
                break
            assert time.monotonic() < deadline, "nothing listens"
            time.sleep(0.02)
        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
    m = msg()
    broker.publish([m])
    fetcher.join(20)
    assert not fetcher.is_alive()
    assert [Message.decode(d.raw).id for d in got[0]] == [m.id]  # type: ignore[attr-defined]


# -- a server that crashes -------------------------------------------------------------------


def test_a_server_killed_and_restarted_keeps_what_was_committed(
    postgres_private: PostgresServer,
) -> None:
    url = f"{postgres_private.url}?schema=crash"
    broker = make_broker(url)
    try:
        sent = [msg() for _ in range(50)]
        broker.publish(sent)
        c = broker.consumer(["q"])
        held = c.fetch(10, 1)
        c.ack(held)
        postgres_private.kill()
        with pytest.raises(BrokerError) as caught:
            broker.publish([msg()])
        assert "\n" not in str(caught.value)
        postgres_private.start()
        # the pool's connections died with the server: the next operations reconnect
        deadline = time.monotonic() + 30
        while True:
            try:
                stats = broker.stats(["q"])["q"]
                break
            except BrokerError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert stats.ready + stats.in_flight == 40
        late = msg()
        broker.publish([late])
        reader = make_broker(url)
        got = []
        while batch := reader.consumer(["q"]).fetch(100, 0.5):
            got += batch
        reader.close()
        ids = {Message.decode(d.raw).id for d in got}
        assert late.id in ids
        assert ids == {m.id for m in sent[10:]} | {late.id}
    finally:
        broker.close()


def test_an_app_on_postgresql_runs_a_task_and_returns_its_result(postgres_url: str) -> None:
    app = Hurtle(postgres_url)

    @app.task(store_result=True)
    def add(x: int, y: int) -> int:
        return x + y

    worker = app.worker()
    thread = worker.run_in_thread()
    try:
        assert add.send(5, 6).result(timeout=20) == 11
    finally:
        worker.stop()
        thread.join(30)
        app.close()
