"""The outbox (``outbox=``): sends with ``connection=`` on a Redis, Redis Cluster or NATS broker
are written to a table in the application's PostgreSQL database, in its transaction, and a relay
moves what commits to the broker, each message once.

"Never runs" is shown as in ``test_postgres_transactions``: the outbox is relayed until empty,
then a burst worker runs everything the broker has, and what ran is exactly what committed.
Exactly once is counted in the broker by message id, after relays were killed with SIGKILL
while they moved thousands of rows."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import run_django_client, run_hurtle
from hurtle import Hurtle, chain
from hurtle.brokers.postgres.relay import Relay
from hurtle.errors import BrokerError, ConfigurationError
from hurtle.message import Message

ROOT = Path(__file__).resolve().parents[2]
#: Longest any wait below may take before the test fails (nothing is timed, only bounded).
PATIENCE = 60.0


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


class Shop:
    """An app on a broker with an outbox in the session's database, and a task that records
    its calls."""

    def __init__(self, broker_url: str, outbox_url: str) -> None:
        self.database = outbox_url.partition("?")[0]
        self.app = Hurtle(broker_url, outbox=outbox_url)
        self.ran: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

        @self.app.task(name="shop.add")
        def add(x: int, y: int) -> int:
            with self.lock:
                self.ran.append((x, y))
            return x + y

        @self.app.task(name="shop.once", unique_for=3600)
        def once(key: str) -> None:
            self.ran.append(("once", key))

        self.add = add
        self.once = once

    def relay_all(self) -> int:
        """Move the whole outbox to the broker (one relay pass until empty)."""
        table = self.app.outbox
        assert table is not None
        relay = Relay(table, self.app.broker)
        with table.connect() as conn:
            while relay.move(conn):
                pass
        return relay.relayed

    def waiting(self) -> int:
        table = self.app.outbox
        assert table is not None
        with table.connect() as conn:
            row = conn.execute(table.COUNT).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return int(row[0])

    def run_all(self) -> list[tuple[Any, ...]]:
        """Relay the outbox, then run everything the broker has (a burst worker)."""
        self.relay_all()
        self.ran.clear()
        self.app.worker(burst=True).run()
        return sorted(self.ran)


@pytest.fixture(params=["redis", "redis-cluster", "nats"])
def broker_url(request: pytest.FixtureRequest) -> str:
    fixture = {"redis": "redis_url", "redis-cluster": "redis_cluster_url", "nats": "nats_url"}
    return str(request.getfixturevalue(fixture[request.param]))


@pytest.fixture
def shop(broker_url: str, postgres_url: str) -> Iterator[Shop]:
    s = Shop(broker_url, postgres_url)
    yield s
    s.app.close()


def test_a_rolled_back_send_never_runs_and_a_committed_one_runs_psycopg(shop: Shop) -> None:
    with psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn).send(1, 1)
        shop.add.options(connection=conn).send_many([(2, 2), (3, 3)])
        conn.rollback()
        handle = shop.add.options(connection=conn).send(4, 4)
        shop.add.options(connection=conn).send_many([(5, 5), (6, 6)])
        shop.add.apply_async((7, 7), connection=conn)
        chain(shop.add.s(8, 8)).send(connection=conn)
        assert shop.waiting() == 0  # nothing is seen before the commit
        conn.commit()
        shop.add.apply_async((9, 9), connection=conn)
        conn.rollback()
    assert shop.waiting() == 5
    assert shop.run_all() == [(4, 4), (5, 5), (6, 6), (7, 7), (8, 8)]
    assert shop.waiting() == 0
    assert isinstance(handle.id, str)


def test_a_rolled_back_send_never_runs_and_a_committed_one_runs_sqlalchemy(shop: Shop) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(
        shop.database.replace("postgresql://", "postgresql+psycopg://")
    )
    try:
        with Session(engine) as session:
            shop.add.options(connection=session).send(1, 1)
            session.rollback()
        with Session(engine) as session:
            shop.add.options(connection=session).send(2, 2)
            session.commit()
        with engine.connect() as c:  # no transaction yet: the send begins one
            shop.add.options(connection=c).send_many([(3, 3), (4, 4)])
            c.commit()
        with engine.connect() as c:
            shop.add.options(connection=c).send(5, 5)
            c.rollback()
    finally:
        engine.dispose()
    assert shop.run_all() == [(2, 2), (3, 3), (4, 4)]


def test_a_psycopg2_connection_writes_to_the_outbox_in_its_transaction(
    redis_url: str, postgres_url: str
) -> None:
    psycopg2 = pytest.importorskip("psycopg2")
    shop = Shop(redis_url, postgres_url)
    conn = psycopg2.connect(shop.database)
    try:
        shop.add.options(connection=conn).send_many([(1, 1), (2, 2)])
        conn.rollback()
        shop.add.options(connection=conn).send_many([(3, 3), (4, 4)])
        conn.commit()
    finally:
        conn.close()
    assert shop.run_all() == [(3, 3), (4, 4)]
    shop.app.close()


def test_eager_mode_runs_a_send_with_a_connection_at_the_send_not_through_the_outbox(
    redis_url: str, postgres_url: str
) -> None:
    from hurtle.testing import eager

    shop = Shop(redis_url, postgres_url)
    with eager(shop.app), psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn).send(1, 2)
        conn.rollback()
    assert shop.ran == [(1, 2)]
    assert shop.waiting() == 0
    shop.app.close()


def test_a_unique_task_is_refused_through_the_outbox(redis_url: str, postgres_url: str) -> None:
    shop = Shop(redis_url, postgres_url)
    refused = pytest.raises(ConfigurationError, match="unique_for cannot be sent with connection")
    with psycopg.connect(shop.database) as conn, refused:
        shop.once.options(connection=conn).send("a")
    assert shop.waiting() == 0
    shop.app.close()


def test_the_outbox_must_be_postgresql_and_beside_a_broker_that_relays(redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="outbox must be a PostgreSQL URL"):
        Hurtle(redis_url, outbox="redis://127.0.0.1:6379")
    with pytest.raises(ConfigurationError, match="PostgreSQL broker writes connection= sends"):
        Hurtle("postgresql://postgres@127.0.0.1/x", outbox="postgresql://postgres@127.0.0.1/x")
    with pytest.raises(ConfigurationError, match="a sqlite broker cannot relay one"):
        Hurtle("sqlite:///x.db", outbox="postgresql://postgres@127.0.0.1/x")


def test_an_unreachable_outbox_database_is_one_broker_error_line(
    redis_url: str, tmp_path: Path
) -> None:
    app = Hurtle(redis_url, outbox="postgresql://postgres@127.0.0.1:1/nowhere")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(BrokerError) as caught:
        add.options(connection=object()).send(1, 2)
    assert "\n" not in str(caught.value)
    assert "127.0.0.1:1" in str(caught.value)
    (tmp_path / "unreachable_app.py").write_text(
        f"from hurtle import Hurtle\n"
        f"app = Hurtle({redis_url!r}, outbox='postgresql://postgres@127.0.0.1:1/nowhere')\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "hurtle", "outbox", "relay", "unreachable_app:app"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("hurtle: error: PostgreSQL"), (
        out.stderr
    )


# -- exactly once -----------------------------------------------------------------------------


def _fill(shop: Shop, total: int, per_transaction: int = 1000) -> list[str]:
    """Commit ``total`` sends through the outbox, ``per_transaction`` a transaction; their ids."""
    ids: list[str] = []
    with psycopg.connect(shop.database) as conn:
        for start in range(0, total, per_transaction):
            calls = [(i, i) for i in range(start, min(start + per_transaction, total))]
            ids += [h.id for h in shop.add.options(connection=conn).send_many(calls)]
            conn.commit()
    return ids


def _ids_in_redis(redis_url: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(redis_url)
    raws = client.lrange("hurtle:{default}:ready:0", 0, -1)
    client.close()
    return [Message.decode(raw).id for raw in raws]


def test_relays_killed_mid_batch_publish_every_row_exactly_once(
    redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    shop = Shop(redis_url, postgres_url)
    # ten of the relay's batches (4,000 messages each): enough that a kill lands in one
    ids = _fill(shop, 40_000)
    (tmp_path / "killed_app.py").write_text(
        f"from hurtle import Hurtle\napp = Hurtle({redis_url!r}, outbox={postgres_url!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{tmp_path}"}
    rng = random.Random(28)
    kills = 0
    cut = 0  # kills that left part of the outbox behind: the relay died while moving it
    deadline = time.monotonic() + 4 * PATIENCE
    while shop.waiting():
        assert time.monotonic() < deadline, "the outbox never emptied"
        before = shop.waiting()
        with subprocess.Popen(
            [sys.executable, "-m", "hurtle", "outbox", "relay", "killed_app:app"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("relaying")
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        kills += 1
        cut += 0 < shop.waiting() < before
    published = _ids_in_redis(redis_url)
    assert len(published) == len(set(published)), "a message was published twice"
    assert sorted(published) == sorted(ids)
    assert kills >= 2 and cut >= 1, (kills, cut)
    shop.app.close()


def test_a_batch_published_before_its_relay_died_is_not_published_again(shop: Shop) -> None:
    ids = _fill(shop, 300, per_transaction=100)
    table = shop.app.outbox
    assert table is not None
    with table.connect() as conn:  # what a relay does before it dies: publish, no delete
        rows = conn.execute(table.SELECT, (2,)).fetchall()  # type: ignore[arg-type]
    payloads = [bytes(raw) for _, bodies in rows for raw in bodies]
    assert len(payloads) == 200
    units = [len(bodies) for _, bodies in rows]  # as the relay publishes them: a row a unit
    shop.app.broker.publish_once([Message.decode(raw) for raw in payloads], payloads, units)
    assert shop.waiting() == 300
    assert shop.relay_all() == 300  # the next relay reads the 200 again, and 100 more
    ran = shop.run_all()
    assert ran == sorted((i, i) for i in range(300))  # each once
    assert len(ids) == 300


def test_two_relays_at_once_publish_each_row_once(redis_url: str, postgres_url: str) -> None:
    shop = Shop(redis_url, postgres_url)
    ids = _fill(shop, 5_000)
    table = shop.app.outbox
    assert table is not None
    stop = threading.Event()
    relays = [Relay(table, shop.app.broker, poll_interval=0.05) for _ in range(2)]
    threads = [threading.Thread(target=r.run, args=(stop,)) for r in relays]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: shop.waiting() == 0, "the outbox to empty")
        ids += _fill(shop, 1_500, per_transaction=100)  # while both run
        wait_for(lambda: shop.waiting() == 0, "the outbox to empty again")
        assert sum(r.active.is_set() for r in relays) == 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sum(r.relayed for r in relays) == 6_500  # one relay worked: nothing read twice
    published = _ids_in_redis(redis_url)
    assert len(published) == len(set(published))
    assert sorted(published) == sorted(ids)
    shop.app.close()


def test_publish_once_skips_ids_it_stored_on_a_cluster_too(redis_cluster_url: str) -> None:
    from hurtle.brokers import make_broker

    broker = make_broker(redis_cluster_url)
    messages = [
        Message(f"id{i}", "t", f"q{i % 3}", (i,), {}, 0, 0, 0.0, time.time(), {}, 0)
        for i in range(30)
    ]
    broker.publish_once(messages[:20])
    broker.publish_once(messages)  # the first 20 again, and 10 new
    stats = broker.stats([f"q{i}" for i in range(3)])
    assert sum(s.ready for s in stats.values()) == 30
    broker.close()


def test_publish_once_stores_or_skips_each_unit_whole_under_its_first_id_per_queue(
    redis_url: str,
) -> None:
    """A unit (an outbox row) is one key per queue: the id of its first message there. A unit
    seen before is skipped whole, one not seen is stored whole, in every queue it has messages
    in; units that do not add up to the messages are refused before anything is stored."""
    import redis
    from hurtle.brokers import make_broker

    broker = make_broker(redis_url)
    now = time.time()
    messages = [
        Message(f"u{i}", "t", f"q{i % 2}", (i,), {}, 0, i % 3, 0.0, now, {}, 0) for i in range(12)
    ]
    broker.publish_once(messages[:6], None, [6])  # one unit: u0 in q0, u1 in q1
    client = redis.Redis.from_url(redis_url)
    held = {bytes(k) for q in ("q0", "q1") for k in client.smembers(f"hurtle:{{{q}}}:sent:0")}
    client.close()
    assert held == {b"u0", b"u1"}
    broker.publish_once(messages, None, [6, 4, 2])  # the first again, and two new units
    stats = broker.stats(["q0", "q1"])
    assert stats["q0"].ready + stats["q1"].ready == 12
    got = broker.consumer(["q0", "q1"]).fetch(50, 0)
    assert sorted(Message.decode(d.raw).id for d in got) == sorted(m.id for m in messages)
    with pytest.raises(ValueError, match="add up to"):
        broker.publish_once(messages, None, [6, 4])
    assert sum(s.ready for s in broker.stats(["q0", "q1"]).values()) == 0
    broker.close()


def test_a_message_too_large_for_redis_leaves_the_rest_of_its_row_relayed_once(
    redis_url: str, postgres_url: str
) -> None:
    """A row whose first message is kept back in the dead table is published from its next
    one: a batch taken again after a relay died meets the same key."""
    shop = Shop(redis_url, postgres_url)
    shop.app.broker.max_message_size = 1_000_000  # what a smaller broker would take
    with psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn).send_many([("x" * 2_000_000, "y"), (1, 1), (2, 2)])
        shop.add.options(connection=conn).send("x" * 2_000_000, "z")  # a row left empty
        shop.add.options(connection=conn).send(3, 3)
        conn.commit()
    table = shop.app.outbox
    assert table is not None
    relay = Relay(table, shop.app.broker)
    with table.connect() as conn:
        with conn.transaction():  # published, then rolled back: as if it died before its commit
            assert relay.move(conn) == 5
            raise psycopg.Rollback
        assert shop.waiting() == 5
        assert relay.move(conn) == 5
    assert relay.buried == 4 and relay.relayed == 6  # each pass: 2 kept back, 3 published
    ran = shop.run_all()
    assert ran == [(1, 1), (2, 2), (3, 3)]  # each once
    shop.app.close()


def test_a_psycopg_connection_that_binds_on_the_client_writes_to_the_outbox(
    redis_url: str, postgres_url: str
) -> None:
    """A cursor that binds parameters on the client (Django's, or ``cursor_factory=``
    ``ClientCursor``) takes the messages as a list, not as the binary array a server-side
    cursor is given."""
    shop = Shop(redis_url, postgres_url)
    with psycopg.connect(shop.database, cursor_factory=psycopg.ClientCursor) as conn:
        shop.add.options(connection=conn).send_many([(1, 1), (2, 2)])
        shop.add.options(connection=conn).send(3, 3)
        conn.commit()
    assert shop.run_all() == [(1, 1), (2, 2), (3, 3)]
    shop.app.close()


def test_a_row_is_stored_compressed_with_lz4_where_the_server_has_it(
    redis_url: str, postgres_url: str
) -> None:
    shop = Shop(redis_url, postgres_url)
    table = shop.app.outbox
    assert table is not None
    with psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn).send_many([(i, i) for i in range(1000)])
        conn.commit()
        row = conn.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        ).fetchone()
        [(how,)] = conn.execute(
            f'SELECT pg_column_compression(bodies) FROM "{table.schema}".outbox'  # type: ignore[arg-type]
        ).fetchall()
    assert how == ("lz4" if row and row[0] else None)
    assert shop.run_all() == [(i, i) for i in range(1000)]
    shop.app.close()


def test_publish_once_remembers_the_newest_ids_in_bounded_generations(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis
    from hurtle.brokers import make_broker
    from hurtle.brokers.redis import broker as redis_broker

    monkeypatch.setattr(redis_broker, "ONCE_KEEP", 10)
    broker = make_broker(redis_url)
    batches = [
        [Message(f"b{b}-{i}", "t", "q", (i,), {}, 0, 0, 0.0, time.time(), {}, 0) for i in range(5)]
        for b in range(8)
    ]
    for batch in batches:
        broker.publish_once(batch)
    assert broker.stats(["q"])["q"].ready == 40
    broker.publish_once(batches[-1])  # the newest batch again: remembered, skipped
    broker.publish_once(batches[-2] + batches[-1][:2])
    assert broker.stats(["q"])["q"].ready == 40
    broker.publish_once(batches[0])  # long forgotten: the memory is bounded
    assert broker.stats(["q"])["q"].ready == 45
    client = redis.Redis.from_url(redis_url)
    held = client.scard("hurtle:{q}:sent:0") + client.scard("hurtle:{q}:sent:1")
    client.close()
    assert held <= 2 * 10 + 5
    broker.close()


def test_a_worker_of_an_app_with_an_outbox_relays_one_at_a_time(
    broker_url: str, postgres_url: str
) -> None:
    from hurtle.middleware.relay import OutboxRelay

    shop = Shop(broker_url, postgres_url)
    workers = [shop.app.worker(pool="threads", concurrency=2) for _ in range(2)]
    threads = [w.run_in_thread() for w in workers]
    relays = [next(m for m in w.middleware if isinstance(m, OutboxRelay)) for w in workers]

    def active() -> list[int]:
        return [i for i, m in enumerate(relays) if m.relay.active.is_set()]  # type: ignore[attr-defined]

    try:
        wait_for(lambda: len(active()) == 1, "one worker's relay to take the lock")
        with psycopg.connect(shop.database) as conn:
            shop.add.options(connection=conn).send_many([(i, i) for i in range(50)])
            conn.commit()
        wait_for(lambda: len(shop.ran) == 50, "the committed sends to run")
        assert len(active()) == 1
        first = active()[0]
        workers[first].stop()
        threads[first].join(PATIENCE)
        wait_for(lambda: active() == [1 - first], "the other worker's relay to take over")
        with psycopg.connect(shop.database) as conn:
            shop.add.options(connection=conn).send(100, 100)
            conn.commit()
        wait_for(lambda: len(shop.ran) == 51, "the send after the takeover to run")
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(PATIENCE)
        shop.app.close()
    assert sorted(shop.ran) == sorted([(i, i) for i in range(50)] + [(100, 100)])


def test_the_outbox_relays_in_a_subprocess_from_the_cli_until_stopped(
    redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    shop = Shop(redis_url, postgres_url)
    ids = _fill(shop, 10)
    (tmp_path / "cli_app.py").write_text(
        textwrap.dedent(
            f"""
            from hurtle import Hurtle
            app = Hurtle({redis_url!r}, outbox={postgres_url!r})
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{tmp_path}"}
    count = subprocess.run(
        [sys.executable, "-m", "hurtle", "outbox", "count", "cli_app:app"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert count.stdout.startswith("10 messages wait"), count.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "hurtle", "outbox", "relay", "cli_app:app"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: shop.waiting() == 0, "the relay to empty the outbox")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 0
    assert "stopped: 10 messages relayed" in out
    assert sorted(_ids_in_redis(redis_url)) == sorted(ids)
    shop.app.close()


def test_a_message_too_large_for_nats_is_kept_in_the_outbox_dead_table_and_the_rest_relayed(
    nats_url: str, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NATS stores 1 MiB a message (its default ``max_payload``); the outbox takes more. The
    large one must neither block the relay nor be dropped: it ends in ``outbox_dead``."""
    shop = Shop(nats_url, postgres_url)
    with psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn).send_many([(1, 1), (2, 2)])
        big = shop.add.options(connection=conn).send("x" * 2_000_000, "y")
        shop.add.options(connection=conn).send(3, 3)
        conn.commit()
    assert shop.app.broker.max_message_size < 2_000_000
    with caplog.at_level("ERROR", logger="hurtle.brokers.postgres.relay"):
        ran = shop.run_all()
    assert ran == [(1, 1), (2, 2), (3, 3)]
    assert shop.waiting() == 0
    assert big.id in caplog.text and "shop.add" in caplog.text
    table = shop.app.outbox
    assert table is not None
    with table.connect() as conn:
        [(id_, queue, reason, _)] = conn.execute(table.DEAD, (10,)).fetchall()  # type: ignore[arg-type]
    assert (id_, queue) == (big.id, "default")
    assert "larger than the" in reason and "never published" in reason
    (tmp_path / "big_app.py").write_text(
        f"from hurtle import Hurtle\napp = Hurtle({nats_url!r}, outbox={postgres_url!r})\n"
    )
    count = run_hurtle("outbox", "count", "big_app:app", cwd=tmp_path)
    assert count.returncode == 0, count.stderr
    assert "0 messages wait" in count.stdout
    assert "1 messages were too large" in count.stdout and big.id in count.stdout
    shop.app.close()


def test_a_delayed_send_through_the_outbox_waits_its_delay_in_the_broker(shop: Shop) -> None:
    """The delay counts from the send (its eta is fixed in the message at the write), not
    from the relay: relayed at once, the message waits in the broker's delayed set."""
    with psycopg.connect(shop.database) as conn:
        shop.add.options(connection=conn, delay=2.0).send(7, 7)
        shop.add.options(connection=conn).send(1, 1)
        conn.commit()
    sent = time.time()
    assert shop.relay_all() == 2
    stats = shop.app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.delayed) == (1, 1)
    worker = shop.app.worker(pool="threads", concurrency=2)
    thread = worker.run_in_thread()
    try:
        wait_for(lambda: len(shop.ran) == 2, "the delayed send to run")
        ran_at = time.time()
    finally:
        worker.stop()
        thread.join(PATIENCE)
    assert shop.ran == [(1, 1), (7, 7)]
    assert ran_at - sent >= 1.5  # not before its delay (less the relay's own milliseconds)


def test_django_s_connection_writes_to_the_outbox_in_the_atomic_block(
    redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """Django's settings are configured once per process: the project runs in one of its own."""
    pytest.importorskip("django")
    shop = Shop(redis_url, postgres_url)
    printed = run_django_client(
        tmp_path,
        shop.database,
        f"""
            app = Hurtle({redis_url!r}, outbox={postgres_url!r})

            @app.task(name="shop.add")
            def add(x, y):
                return x + y

            class Undo(Exception):
                pass

            try:
                with transaction.atomic():
                    add.options(connection=connection).send(1, 1)
                    raise Undo
            except Undo:
                pass
            with transaction.atomic():
                add.options(connection=connection).send(2, 2)
                with transaction.atomic():  # a savepoint, rolled back with its send
                    add.options(connection=connection).send(3, 3)
                    transaction.set_rollback(True)
            print("done", flush=True)
            """,
    )
    assert printed.strip() == "done"
    assert shop.run_all() == [(2, 2)]
    shop.app.close()
