"""What only the PostgreSQL broker has: its schema (made on first use, versions checked, upgraded
by ``hurtle db upgrade``), its one-line errors for a server it cannot use, its notifications
lost with a connection, and a server that crashes and restarts under it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import free_port
from hurtle import Hurtle
from hurtle.brokers import QueueStats, make_broker
from hurtle.brokers.postgres import PostgresBroker, sql, upgrade_schema
from hurtle.brokers.postgres.sql import holder_key
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
    make_broker(postgres_url).close()  # version 2; this "hurtle" has a version 3
    schema = schema_of(postgres_url)
    monkeypatch.setattr(sql, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(sql.UPGRADES, 2, "ALTER TABLE {s}.queues ADD COLUMN note text")
    (tmp_path / "pgapp.py").write_text(
        f"from hurtle import Hurtle\napp = Hurtle({postgres_url!r})\n"
        "@app.task\ndef add(x, y):\n    return x + y\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["worker", "pgapp:app", "--burst"]) == 2
    err = capsys.readouterr().err
    assert "at version 2, older than this hurtle's (3): run hurtle db upgrade APP" in err
    assert main(["db", "upgrade", "pgapp:app"]) == 0
    assert "from version 2 to 3" in capsys.readouterr().out
    execute(postgres_url, f'SELECT note FROM "{schema}".queues')  # the upgrade ran
    make_broker(postgres_url).close()  # and the broker takes the schema now
    assert main(["db", "upgrade", "pgapp:app"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_version_1_schema_is_upgraded_and_a_dead_workers_batch_still_comes_back(
    postgres_url: str,
) -> None:
    """Version 1 recorded each claimed batch in ``claims`` (its ids); version 2 records each
    worker that may hold rows in ``holders``. A batch claimed under version 1 by a worker that
    died meanwhile goes back to its queue after the upgrade."""
    b = make_broker(postgres_url)
    m = msg()
    b.publish([m])
    held = b.consumer(["q"], worker_id="old-worker").fetch(10, 0)
    assert len(held) == 1
    b.close()
    s = f'"{schema_of(postgres_url)}"'
    with psycopg.connect(postgres_url.partition("?")[0], autocommit=True) as conn:
        conn.execute(f"DROP TABLE {s}.holders")  # type: ignore[arg-type]
        conn.execute(  # type: ignore[arg-type]
            f"CREATE TABLE {s}.claims (batch bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "worker text NOT NULL, ids bigint[] NOT NULL)"
        )
        conn.execute(  # type: ignore[arg-type]
            f"INSERT INTO {s}.claims (worker, ids) VALUES ('old-worker', %s)", ([held[0].receipt],)
        )
        conn.execute(f"DELETE FROM {s}.workers")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {s}.meta SET version = 1")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="at version 1, older"):
        make_broker(postgres_url)
    assert upgrade_schema(postgres_url) == (1, sql.SCHEMA_VERSION)
    with psycopg.connect(postgres_url.partition("?")[0], autocommit=True) as conn:
        assert conn.execute(f"SELECT worker FROM {s}.holders").fetchall() == [("old-worker",)]  # type: ignore[arg-type]
        assert conn.execute("SELECT to_regclass(%s)", (f"{s}.claims",)).fetchone() == (None,)
    b = make_broker(postgres_url)
    try:
        c = b.consumer(["q"])
        c.heartbeat()  # the old worker has no row in workers: what it held goes back
        again = c.fetch(10, 0)
        assert [Message.decode(d.raw).id for d in again] == [m.id]
        assert again[0].receipt != held[0].receipt
    finally:
        b.close()


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
    """As with Redis, the broker is made (a worker started while its server restarts waits for
    it): the first operation says what is wrong."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    broker = make_broker(url)
    for operation in (lambda: broker.publish([msg("q")]), lambda: broker.stats(["q"])):
        with pytest.raises(BrokerError) as caught:
            operation()
        text = str(caught.value)
        assert "\n" not in text and "Connection refused" in text
        assert "is the PostgreSQL server running there" in text
    broker.close()


def test_a_broker_made_while_its_server_is_down_makes_the_schema_when_it_is_up(
    postgres_private: PostgresServer,
) -> None:
    postgres_private.stop()
    broker = make_broker(f"{postgres_private.url}?schema=later")
    consumer_error = None
    try:
        broker.consumer(["q"])  # a worker's start: no error while the server is away
    except BrokerError as err:
        consumer_error = err
    assert consumer_error is None
    with pytest.raises(BrokerError, match="Connection refused"):
        broker.publish([msg("q")])
    postgres_private.start()
    broker.publish([msg("q"), msg("q")])
    assert broker.stats(["q"])["q"] == QueueStats(ready=2)
    assert len(broker.consumer(["q"]).fetch(10, 1)) == 2
    broker.close()


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


def test_a_beat_waits_for_the_claim_in_flight_of_a_worker_it_takes_for_dead(
    broker: PostgresBroker,
) -> None:
    """A worker taken for dead (no row in ``workers``) claims again while another worker's beat
    recovers: the beat waits for that claim to commit, then sees the worker back, and leaves it
    its rows and its holder row (without which its rows would not come back if it died)."""
    s = broker._sql
    schema = f'"{broker.schema}"'
    broker.publish([msg(), msg()])
    assert len(broker.consumer(["q"], worker_id="w-back").fetch(1, 0)) == 1
    other = broker.consumer(["q"], worker_id="beater")
    with psycopg.connect(broker._conninfo, autocommit=True) as admin:
        admin.execute(f"DELETE FROM {schema}.workers WHERE worker_id = 'w-back'")  # type: ignore[arg-type]
        with psycopg.connect(broker._conninfo) as claim:  # its claim, not committed yet
            claim.execute(s.ADD_WORKER, ("w-back", 30.0))  # type: ignore[arg-type]
            claim.execute(s.SHARE_KEY, (holder_key(broker.schema, "w-back"),))  # type: ignore[arg-type]
            taken = claim.execute(s.CLAIM_ONE, ("q", "q", 1, "w-back", "w-back")).fetchall()  # type: ignore[arg-type]
            assert len(taken) == 1
            beat = threading.Thread(target=other.heartbeat)
            beat.start()
            deadline = time.monotonic() + 20
            while beat.is_alive():  # until the beat waits on the worker's key
                row = admin.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                    "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ).fetchone()
                if row is not None and row[0]:
                    break
                assert time.monotonic() < deadline, "the beat neither waits nor ends"
                time.sleep(0.01)
            claim.commit()
        beat.join(20)
        assert not beat.is_alive()
        holders = admin.execute(f"SELECT worker FROM {schema}.holders").fetchall()  # type: ignore[arg-type]
        held = admin.execute(  # type: ignore[arg-type]
            f"SELECT count(*) FROM {schema}.messages WHERE worker = 'w-back'"
        ).fetchone()
    assert ("w-back",) in holders
    assert held == (2,)


# -- a reply lost after its commit ------------------------------------------------------------


def lose_the_next_reply(broker: PostgresBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next pipelined transaction of ``broker`` (a fetch's) commits, then its connection is
    terminated before the reply is read: the consumer sees the error of a dead connection,
    as when a server goes away between its commit and its answer."""
    real = broker._send

    def send(doing: str, statements: Any, read: Any) -> Any:
        monkeypatch.setattr(broker, "_send", real)

        def lost(cur: psycopg.Cursor[Any]) -> Any:
            with psycopg.connect(broker._conninfo, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(%s, 10000)", (cur.connection.info.backend_pid,)
                )
            cur.connection.execute("SELECT 1")  # the connection is gone: this raises
            return read(cur)

        return real(doing, statements, lost)

    monkeypatch.setattr(broker, "_send", send)


@pytest.mark.parametrize("holding", [0, 2])
def test_a_claim_committed_whose_reply_was_lost_is_run_by_the_next_fetch(
    broker: PostgresBroker, monkeypatch: pytest.MonkeyPatch, holding: int
) -> None:
    """The claim committed in the worker's name, its reply lost: the fetch failed, and the next
    one hands over those rows (once each, and none the worker already holds)."""
    sent = [msg() for _ in range(5)]
    broker.publish(sent)
    c = broker.consumer(["q"])
    held = c.fetch(holding, 0) if holding else []
    assert len(held) == holding
    lose_the_next_reply(broker, monkeypatch)
    with pytest.raises(BrokerError):
        c.fetch(3, 0)
    assert broker.stats(["q"])["q"].in_flight == holding + 3  # in its name all the same
    again = c.fetch(10, 0)
    assert [Message.decode(d.raw).id for d in held + again] == [m.id for m in sent[: holding + 3]]
    c.ack(held + again)
    assert broker.stats(["q"])["q"] == QueueStats(ready=2 - holding)
    c.ack(c.fetch(10, 0))
    late = msg()
    broker.publish([late])
    assert [Message.decode(d.raw).id for d in c.fetch(10, 0)] == [late.id]


def test_what_a_lost_claim_took_comes_a_fetch_at_a_time_within_its_room(
    broker: PostgresBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetches after the failure have less room than the lost claim took: each hands over
    what fits, in the order of the queue, until none is left; then claims go on as before."""
    sent = [msg() for _ in range(4)]
    broker.publish(sent)
    c = broker.consumer(["q"])
    lose_the_next_reply(broker, monkeypatch)
    with pytest.raises(BrokerError):
        c.fetch(3, 0)
    got = [c.fetch(2, 0), c.fetch(2, 0), c.fetch(2, 0)]
    assert [[Message.decode(d.raw).id for d in batch] for batch in got] == [
        [m.id for m in sent[:2]],
        [sent[2].id],
        [sent[3].id],
    ]
    for batch in got:
        c.ack(batch)
    assert broker.stats(["q"])["q"] == QueueStats()


def test_an_ack_and_fetch_committed_whose_reply_was_lost_is_sent_again_harmlessly(
    broker: PostgresBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acknowledgements and the next claim committed, the reply lost: sent again, the
    acknowledgements find nothing to delete, and the rows claimed come with the next batch."""
    sent = [msg() for _ in range(4)]
    broker.publish(sent)
    c = broker.consumer(["q"])
    held = c.fetch(2, 0)
    lose_the_next_reply(broker, monkeypatch)
    with pytest.raises(BrokerError):
        c.ack_and_fetch(held, 10, 0)
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=2)
    again = c.ack_and_fetch(held, 10, 0)
    assert [Message.decode(d.raw).id for d in again] == [m.id for m in sent[2:]]
    c.ack(again)
    assert broker.stats(["q"])["q"] == QueueStats()


def ids_of(deliveries: list[Any]) -> list[str]:
    return [Message.decode(d.raw).id for d in deliveries]


def test_a_prefetched_batch_comes_with_the_next_fetch_and_its_acks_with_the_claim_after(
    broker: PostgresBroker,
) -> None:
    """A solo worker's prefetch claims the next batch on a thread; the fetch after returns it,
    and the acknowledgements handed to that fetch are recorded by the next claim (till then
    their rows stay held), or by ``close`` before it hands back what the worker holds."""
    sent = [msg() for _ in range(7)]
    broker.publish(sent)
    c = broker.consumer(["q"])
    first = c.fetch(2, 0)
    c.prefetch(2)
    second = c.ack_and_fetch(first, 2, 0)
    assert ids_of(second) == [m.id for m in sent[2:4]]
    assert broker.stats(["q"])["q"] == QueueStats(ready=3, in_flight=4)  # first: owed
    c.prefetch(2)  # records first's acknowledgements with its claim
    third = c.ack_and_fetch(second, 2, 0)
    assert ids_of(third) == [m.id for m in sent[4:6]]
    assert broker.stats(["q"])["q"] == QueueStats(ready=1, in_flight=4)  # second: owed
    c.prefetch(2)  # in flight at the close: what it claims goes back with the rest
    c.close()
    assert broker.stats(["q"])["q"] == QueueStats(ready=3)  # third and the seventh
    again = broker.consumer(["q"])
    assert sorted(ids_of(again.fetch(10, 0))) == sorted(m.id for m in sent[4:])


def test_a_prefetch_after_a_short_batch_claims_nothing_and_take_prefetched_returns_its_batch(
    broker: PostgresBroker,
) -> None:
    """A batch that came short found the queue running dry: no prefetch after it. After a
    full one, ``take_prefetched`` hands over what the prefetch claimed, held as usual."""
    sent = [msg() for _ in range(3)]
    broker.publish(sent[:1])
    c = broker.consumer(["q"])
    assert len(c.fetch(2, 0)) == 1
    broker.publish(sent[1:])
    c.prefetch(2)
    assert c.take_prefetched() == []
    assert broker.stats(["q"])["q"] == QueueStats(ready=2, in_flight=1)
    full = c.fetch(2, 0)
    assert ids_of(full) == [m.id for m in sent[1:]]
    broker.publish([msg(), msg()])
    c.prefetch(2)
    taken = c.take_prefetched()
    assert len(taken) == 2
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=5)
    c.ack(taken)
    assert broker.stats(["q"])["q"] == QueueStats(in_flight=3)


# -- the claim's plan ------------------------------------------------------------------------


def test_a_claim_walks_the_ready_index_when_statistics_say_the_queue_is_empty(
    broker: PostgresBroker,
) -> None:
    """Analyzed while empty, then filled faster than autovacuum comes back (a burst): the claim
    still reads ``messages_ready`` in its order and takes the rows by their key, rather than a
    bitmap scan of the whole queue sorted for every batch, or a hash of the whole table (what
    the planner picks here without ``PIN_CLAIM_PLAN``)."""
    s = broker._sql
    with psycopg.connect(broker._conninfo, autocommit=True) as conn:
        conn.execute(f'ANALYZE "{broker.schema}".messages')  # type: ignore[arg-type]
        broker.publish([msg() for _ in range(5000)])
        for claim, params in (
            (s.CLAIM_ONE, ("q", "q", 1000, "w", "w")),
            (s.CLAIM_MANY, (["q", "r"], 1000, 1000, "w", "w")),
        ):
            with conn.transaction():
                conn.execute(s.PIN_CLAIM_PLAN)  # type: ignore[arg-type]
                rows = conn.execute("EXPLAIN " + claim, params).fetchall()  # type: ignore[arg-type]
            plan = "\n".join(r[0] for r in rows)
            assert "Index Scan using messages_ready" in plan, plan
            assert "Bitmap" not in plan, plan
            assert "Seq Scan on messages" not in plan, plan


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
