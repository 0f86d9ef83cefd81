"""Rate limits, concurrency limits and unique tasks, end to end on one process (memory broker)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from hurtle import ConfigurationError, Hurtle, Message
from hurtle.middleware import limits as mw


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://")


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rate_limit": "50/d"}, "rate_limit must look like '50/s'"),
        ({"rate_limit": "0/s"}, "rate_limit must look like"),
        ({"rate_limit": 50}, "rate_limit must look like"),
        ({"rate_limit_key": lambda **_: "k"}, "rate_limit_key needs rate_limit"),
        ({"rate_limit": "5/s", "rate_limit_key": "user"}, "must be a callable"),
        ({"concurrency_limit": 0}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_limit": 1.5}, "concurrency_limit must be a whole number >= 1"),
        ({"concurrency_key": lambda: "k"}, "concurrency_key needs concurrency_limit"),
        ({"unique_for": 0}, "unique_for must be a finite number of seconds > 0"),
        ({"unique_for": float("inf")}, "unique_for must be"),
        ({"unique_key": lambda: "k"}, "unique_key needs unique_for"),
    ],
)
def test_bad_limit_options_are_refused_at_registration(
    app: Hurtle, options: dict[str, Any], match: str
) -> None:
    def f() -> None: ...

    with pytest.raises(ConfigurationError, match=match):
        app.task(**options)(f)
    assert not app.tasks


@pytest.mark.parametrize(
    ("text", "rate"), [("50/s", (50, 1.0)), ("3/m", (3, 60.0)), (" 7 / h", (7, 3600.0))]
)
def test_rate_limits_are_parsed_once(app: Hurtle, text: str, rate: tuple[int, float]) -> None:
    @app.task(rate_limit=text)
    def f() -> None: ...

    assert f.limits is not None and f.limits.rate == rate


# -- rate limits -----------------------------------------------------------------------------


def test_throttled_messages_run_later_without_spending_attempts(app: Hurtle) -> None:
    ran: list[tuple[int, int]] = []
    plain_done: list[float] = []

    @app.task(rate_limit="20/s", retries=0)
    def slow(i: int) -> None:
        ran.append((i, time.monotonic()))  # type: ignore[arg-type]

    @app.task
    def plain() -> None:
        plain_done.append(time.monotonic())

    slow.send_many([(i,) for i in range(40)])
    plain.send()
    started = time.monotonic()
    app.worker(burst=True).run()
    assert sorted(i for i, _ in ran) == list(range(40))
    assert app.broker.dead_letters("default") == []
    # the plain task behind the backlog did not wait for the throttled ones
    assert plain_done and plain_done[0] < max(t for _, t in ran)
    assert max(t for _, t in ran) - started >= (40 - 20) / 20 * 0.9  # the limit did bind


def test_a_rate_limit_key_that_raises_dead_letters_its_message(app: Hurtle) -> None:
    @app.task(rate_limit="100/s", rate_limit_key=lambda user: f"user:{user['id']}")
    def f(user: Any) -> None: ...

    f.send({"id": 1})
    f.send({})
    app.worker(burst=True).run()
    [dead] = app.broker.dead_letters("default")
    assert "limit key could not be made" in dead.reason and "KeyError" in dead.reason


def test_each_rate_limit_key_has_its_own_tokens(app: Hurtle) -> None:
    starts: dict[str, list[float]] = {"a": [], "b": []}

    @app.task(rate_limit="20/h", rate_limit_key=lambda who: who)  # a burst of 2
    def f(who: str) -> None:
        starts[who].append(time.monotonic())

    f.send_many([("a",), ("a",), ("b",), ("b",), ("a",)])
    worker = app.worker()
    thread = threading.Thread(target=worker.run)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(starts["a"]) < 2 or len(starts["b"]) < 2):
        time.sleep(0.01)
    worker.stop()
    thread.join(10)
    assert len(starts["a"]) == 2 and len(starts["b"]) == 2  # the third "a" waits its turn
    stats = app.broker.stats(["default"])["default"]
    assert stats.delayed == 1 and stats.in_flight == 0
    consumer = app.broker.consumer(["default"])
    assert consumer.fetch(1, 0) == []


# -- concurrency limits ----------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_concurrency_limit_holds_across_workers(app: Hurtle, pool: str) -> None:
    lock = threading.Lock()
    running = [0]
    most = [0]
    done: list[int] = []

    @app.task(concurrency_limit=2)
    def f(i: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
            done.append(i)

    f.send_many([(i,) for i in range(30)])
    workers = [app.worker(burst=True, pool=pool, concurrency=4) for _ in range(3)]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == list(range(30))
    assert most[0] <= 2
    assert app.broker.dead_letters("default") == []


# -- unique tasks ----------------------------------------------------------------------------


def test_a_duplicate_send_returns_the_waiting_message_id(app: Hurtle) -> None:
    @app.task(unique_for=60)
    def f(x: int, y: int = 0) -> None: ...

    first = f.send(1, y=2)
    assert f.send(1, y=2) == first
    assert f.options(priority=5).send(1, y=2) == first
    other = f.send(2)
    assert f.send_many([f.args(1, y=2), (3,), (3,)])[0] == first
    assert f.send(1, 2) != first  # sent differently: another call, unless unique_key says so
    ids = f.send_many([(4,), (4,)])
    assert ids[0] == ids[1]
    consumer = app.broker.consumer(["default"])
    got = [Message.decode(d.raw) for d in consumer.fetch(100, 0)]
    assert len(got) == 5  # (1, y=2), (2,), (1, 2), (3,), (4,)
    assert {first.id, other.id, ids[0].id, f.send(3).id} <= {m.id for m in got}  # running: locked


def test_every_send_names_when_its_lock_ends(app: Hurtle) -> None:
    # a worker that knows the lock cannot have ended yet releases it without reading it
    # (Redis: one HDEL per queue), so each message must carry created + unique_for
    @app.task(unique_for=90)
    def f(x: int) -> None: ...

    f.send(1)
    f.options(priority=3).send(2)
    f.send_many([(3,), (4,)])
    got = [Message.decode(d.raw) for d in app.broker.consumer(["default"]).fetch(100, 0)]
    assert len(got) == 4
    for m in got:
        assert m.unique_until == pytest.approx(m.created + 90)
        assert m.unique.startswith(f"{f.name}:")
        assert m.headers == {}  # the lock is in typed fields: no dict to decode per message


def test_locks_named_in_headers_by_older_senders_are_still_taken_and_released(
    app: Hurtle,
) -> None:
    # a sender from before the ``unique`` fields named the lock in headers; a worker of this
    # version still releases it when the message is settled, both in a batch and when dead
    import msgspec

    ran: list[int] = []

    @app.task(unique_for=60, retries=0)
    def f(x: int) -> None:
        ran.append(x)
        if x == 2:
            raise ValueError("fails for good")

    def old(x: int, until: float) -> Message:
        m = f.message((x,), {})
        return msgspec.structs.replace(m, headers={"unique": f"old:{x}", "unique_until": until})

    now = time.time()
    sent = [old(1, now + 60), old(2, now + 60), old(3, 0.0)]
    assert app.broker.publish_unique(sent, 60) == [m.id for m in sent]
    assert app.broker.publish_unique([old(1, now + 60)], 60) == [sent[0].id]  # held
    app.worker(burst=True).run()
    assert sorted(ran) == [1, 2, 3]
    again = [old(1, now + 60), old(2, now + 60), old(3, 0.0)]
    assert app.broker.publish_unique(again, 60) == [m.id for m in again]  # all released


def test_the_message_format_reads_both_ways_across_the_unique_fields() -> None:
    # a rolling upgrade: workers of the version before these fields ignore them (the lock then
    # ends at its unique_until), and this version reads those workers' messages with none
    import msgspec

    class Before(msgspec.Struct, array_like=True):  # the message as the version before had it
        id: str
        task: str
        queue: str
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        attempt: int = 0
        priority: int = 0
        eta: float = 0.0
        created: float = 0.0
        headers: dict[str, Any] = {}
        expires: float = 0

    new = Message("m1", "t", "q", (1,), unique="t:1", unique_until=1e9)
    read_before = msgspec.msgpack.decode(new.encode(), type=Before)
    assert (read_before.id, read_before.args, read_before.headers) == ("m1", (1,), {})
    older = Message.decode(msgspec.msgpack.encode(Before("m2", "t", "q", (2,))))
    assert (older.id, older.args, older.unique, older.unique_until) == ("m2", (2,), "", 0)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"unique": 5}, "unique must be a str"),
        ({"unique": "k", "unique_until": float("nan")}, "unique_until must be a finite number"),
        ({"unique": "k", "unique_until": -1.0}, "unique_until must be >= 0"),
    ],
)
def test_bad_unique_fields_are_refused_at_publish(
    app: Hurtle, fields: dict[str, Any], match: str
) -> None:
    from hurtle import EncodeError

    m = Message("m1", "t", "q", **fields)
    with pytest.raises(EncodeError, match=match):
        app.broker.publish([m])
    assert app.broker.stats(["q"])["q"].ready == 0


def test_the_lock_ends_when_the_message_is_acknowledged_or_dead(app: Hurtle) -> None:
    @app.task(unique_for=60, unique_key=lambda x, **_: x)
    def f(x: int, fail: bool = False) -> None:
        if fail:
            raise ValueError("no")

    first = f.send(1)
    assert f.send(1, fail=True) == first  # same key: same message
    app.worker(burst=True).run()
    second = f.send(1, fail=True)
    assert second != first
    app.worker(burst=True).run()  # retries=… default: fails for good, dead letter
    assert f.send(1) not in (first, second)


@pytest.mark.parametrize("url", ["memory://", "redis"])
def test_every_lock_of_a_long_batch_ends_with_its_acknowledgement(
    url: str, request: pytest.FixtureRequest
) -> None:
    # a batch's calls are settled in parts (``CALLS_CHUNK``), their locks joined per flush
    app = Hurtle(request.getfixturevalue("redis_url") if url == "redis" else url)
    try:

        @app.task(unique_for=600, retries=0)
        def f(x: int) -> None:
            if x % 97 == 0:
                raise ValueError(x)  # a dead letter: its lock ends too

        first = f.send_many([(i,) for i in range(1000)])
        app.worker(burst=True).run()
        again = f.send_many([(i,) for i in range(1000)])
        assert not {h.id for h in first} & {h.id for h in again}
        assert app.broker.stats(["default"])["default"].ready == 1000
    finally:
        app.close()


def test_a_retry_keeps_the_lock_until_the_last_outcome(app: Hurtle) -> None:
    seen: list[str] = []

    @app.task(unique_for=60, retries=1, retry_delay=0.01)
    def f(x: int) -> None:
        seen.append(f.send(x))  # a duplicate sent while it runs, on each attempt
        if len(seen) == 1:
            raise ValueError("first attempt fails")

    first = f.send(1)
    app.worker(burst=True).run()
    assert seen == [first, first]
    assert f.send(1) != first


def test_an_unreachable_limit_puts_the_batch_back_instead_of_stopping_the_worker(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hurtle.errors import BrokerError
    from hurtle.worker import admission

    ran: list[int] = []
    failures = [2]
    take = app.broker.take_tokens

    def flaky(requests: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise BrokerError("cannot reach the broker")
        return take(requests)

    monkeypatch.setattr(app.broker, "take_tokens", flaky)
    monkeypatch.setattr(admission, "BEFORE_BATCH_PAUSE", 0.05)

    @app.task(rate_limit="1000/s", retries=0)
    def f(i: int) -> None:
        ran.append(i)

    f.send_many([(i,) for i in range(5)])
    app.worker(burst=True).run()
    assert sorted(ran) == list(range(5))
    assert app.broker.dead_letters("default") == []


def test_a_sqlite_file_without_the_limit_tables_is_upgraded(tmp_path: Any) -> None:
    import sqlite3

    from hurtle.brokers import make_broker

    url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    make_broker(url).close()
    conn = sqlite3.connect(tmp_path / "hurtle.db")  # what the previous version wrote
    for table in ("rates", "slots", "uniques"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DROP INDEX dead_message")  # added by version 5
    conn.execute("ALTER TABLE dead DROP COLUMN message_id")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    upgraded = make_broker(url)
    try:
        assert upgraded.take_tokens([("k", 10, 1.0, 1)]) == [(1, 0.0)]
        m = Message(id="m1", task="t", queue="q", headers={"unique": "x"})
        assert upgraded.publish_unique([m], 60) == ["m1"]
        assert upgraded.consumer(["q"]).acquire_slots([("k", 1, 1)]) == [1]
    finally:
        upgraded.close()


def _count_tokens_asked(app: Hurtle, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many tokens each request to the broker asks for, in order (the broker still answers)."""
    asked: list[int] = []
    take = app.broker.take_tokens

    def counting(requests: Any) -> Any:
        asked.extend(wanted for _, _, _, wanted in requests)
        return take(requests)

    monkeypatch.setattr(app.broker, "take_tokens", counting)
    return asked


def _limiter(app: Hurtle, monkeypatch: pytest.MonkeyPatch, clock: list[float]) -> Any:
    """A ``RateLimitMiddleware`` on ``app``'s broker, whose clock reads ``clock[0]``."""
    monkeypatch.setattr(mw, "_monotonic", lambda: clock[0])
    limiter = mw.RateLimitMiddleware()
    limiter._broker = app.broker
    return limiter


def test_a_limit_far_from_binding_takes_a_few_batches_of_tokens_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = Hurtle("memory://", fetch_batch_size=10)
    asked = _count_tokens_asked(app, monkeypatch)
    ran: list[int] = []

    @app.task(rate_limit="1000000/s")
    def f(i: int) -> None:
        ran.append(i)

    f.send_many([(i,) for i in range(50)])
    app.worker(burst=True).run()
    assert sorted(ran) == list(range(50))
    assert len(asked) < 5  # for at least five batches (of at most 10)


@pytest.mark.parametrize(
    ("rate", "batch", "ahead"),
    [
        ("10000000/s", 1000, 4000),  # a safety cap: four batches ahead
        ("100000/s", 1000, 4000),  # 10,000 in RESERVE_HOLD: 8,000 fit
        ("20000/s", 1000, 0),  # 2,000 in RESERVE_HOLD: a batch or two would use them up
        ("50/s", 1, 0),  # a limit that binds: never
        ("50/s", 100, 0),
    ],
)
def test_tokens_are_taken_ahead_only_for_a_limit_far_from_binding(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch, rate: str, batch: int, ahead: int
) -> None:
    @app.task(rate_limit=rate)
    def f() -> None: ...

    asked: list[int] = []

    def granting(requests: Any) -> Any:
        asked.extend(wanted for _, _, _, wanted in requests)
        return [(wanted, 0.0) for _, _, _, wanted in requests]

    monkeypatch.setattr(app.broker, "take_tokens", granting)
    limiter = _limiter(app, monkeypatch, [1000.0])
    assert limiter.admit({f: batch}) == {}
    assert asked == [batch + ahead]
    assert limiter._reserve.get(f.name, (0, 0.0))[0] == ahead


def test_tokens_taken_ahead_are_dropped_once_held_too_long(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    @app.task(rate_limit="1000000/s")
    def f() -> None: ...

    clock = [1000.0]
    asked = _count_tokens_asked(app, monkeypatch)
    limiter = _limiter(app, monkeypatch, clock)
    assert limiter.admit({f: 10}) == {}  # 10 now, 40 ahead
    clock[0] += mw.RESERVE_HOLD / 2
    assert limiter.admit({f: 30}) == {}  # from those 40: no call
    assert asked == [50]
    clock[0] += mw.RESERVE_HOLD  # the 10 left are too old now
    assert limiter.admit({f: 10}) == {}
    assert asked == [50, 50]


def test_tokens_in_hand_count_when_the_limit_refuses_the_rest(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch
) -> None:
    @app.task(rate_limit="1000000/s")
    def f() -> None: ...

    answers = iter([[(50, 0.0)], [(5, 0.25)]])
    monkeypatch.setattr(app.broker, "take_tokens", lambda requests: next(answers))
    limiter = _limiter(app, monkeypatch, [1000.0])
    assert limiter.admit({f: 10}) == {}  # 40 in hand
    # 100 wanted: 40 in hand, 60 asked for, 5 given: 45 run, the rest come back from 0.25 s
    may, wait, _, _ = limiter.admit({f: 100})[f.name]
    assert (may, wait) == (45, 0.25)
    assert limiter._reserve.get(f.name, (0, 0.0))[0] == 0
