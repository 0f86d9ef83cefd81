"""Conformance of adaptive rate limits on every broker: the cut of a key's rate (``Throttle``)
is recorded once, seen by every client, halved again only by a call that began after it, and
climbs back from the record alone (``hurtle.adaptive``); on a worker, a throttled call is put
back on its first attempt and cuts its key."""

from __future__ import annotations

import time
from collections.abc import Callable

from hurtle import Hurtle, Throttle, current
from hurtle.adaptive import HOLD, KEEP, RECOVER, Cut, cut, decode, limit_at
from hurtle.brokers import Broker
from hurtle.ids import new_id

MakeBroker = Callable[..., Broker]
QUEUE = "throttled"


def test_a_cut_halves_the_rate_and_every_client_sees_it(make: MakeBroker) -> None:
    a, b = make(), make()
    now = time.time()
    assert b.get_rate_cuts(["t:k", "t:other"]) == [None, None]
    [made] = cut(a, [("t:k", now - 1.0, 100)], now)
    assert made == Cut(now, 0.5)
    seen = b.get_rate_cuts(["t:k", "t:other"])
    assert [decode(r) for r in seen] == [Cut(now, 0.5), None]  # other keys keep their rate
    assert limit_at(100, decode(seen[0]), now) == 50
    assert limit_at(100, None, now) == 100


def test_only_a_call_that_began_after_the_last_cut_cuts_again(make: MakeBroker) -> None:
    a, b = make(), make()
    t0 = time.time()
    cut(a, [("t:k", t0 - 1.0, 100)], t0)
    # began before the cut (at the old rate), or too soon after it: the cut stands
    t1 = t0 + HOLD + 0.1
    assert cut(b, [("t:k", t0 - 0.5, 100)], t1) == [Cut(t0, 0.5)]
    assert cut(b, [("t:k", t0 + 0.01, 100)], t0 + HOLD / 2) == [Cut(t0, 0.5)]
    # began after it, once it is HOLD old: halved again, from the rate it had climbed to
    [again] = cut(b, [("t:k", t0 + 0.1, 100)], t1)
    climbed = Cut(t0, 0.5).share_at(t1)
    assert climbed > 0.5 and again == Cut(t1, climbed / 2)
    assert decode(a.get_rate_cuts(["t:k"])[0]) == again


def test_a_cut_rate_climbs_back_to_the_whole_limit_without_a_write(broker: Broker) -> None:
    now = time.time()
    [made] = cut(broker, [("t:k", now, 200)], now)
    assert made is not None
    read = decode(broker.get_rate_cuts(["t:k"])[0])
    assert read == made
    # back to the rate before the cut (200) within RECOVER seconds, then whole, and no more
    assert limit_at(200, read, now) == 100
    assert 100 < limit_at(200, read, now + RECOVER / 2) < 200
    assert limit_at(200, read, now + RECOVER) == 200
    assert limit_at(200, read, read.whole_at() + 1000) == 200
    assert read.whole_at() <= now + RECOVER


def test_cuts_never_leave_less_than_one_token_per_period(broker: Broker) -> None:
    now = time.time()
    for _ in range(30):
        now += HOLD + 0.01
        [last] = cut(broker, [("t:floor", now - 0.001, 40)], now)
    assert last is not None and last.share == 1 / 40
    assert limit_at(40, decode(broker.get_rate_cuts(["t:floor"])[0]), now) == 1


def test_several_keys_are_cut_and_read_in_one_call_each(broker: Broker) -> None:
    now = time.time()
    calls: list[str] = []

    class Counting:
        def get_rate_cuts(self, keys: list[str]) -> list[bytes | None]:
            calls.append("get")
            return broker.get_rate_cuts(keys)

        def put_rate_cuts(self, cuts: list[tuple[str, bytes, float]]) -> None:
            calls.append("put")
            broker.put_rate_cuts(cuts)

    found = cut(Counting(), [(f"t:{n}", now, 100) for n in range(20)], now, ["t:none"])
    assert calls == ["get", "put"]
    assert found[:20] == [Cut(now, 0.5)] * 20 and found[20] is None
    assert all(decode(r) == Cut(now, 0.5) for r in broker.get_rate_cuts(["t:0", "t:19"]))


def test_a_cut_record_is_gone_once_its_ttl_passed(broker: Broker) -> None:
    kept = Cut(time.time(), 0.5)
    broker.put_rate_cuts([("t:short", kept.encode(), 0.2), ("t:kept", kept.encode(), KEEP)])
    time.sleep(0.5)
    assert [decode(r) for r in broker.get_rate_cuts(["t:short", "t:kept"])] == [None, kept]


def test_cut_records_are_kept_apart_from_progress_and_debounce(broker: Broker) -> None:
    id_ = new_id()
    broker.put_rate_cuts([(id_, Cut(time.time(), 0.5).encode(), 60)])  # a key like an id
    assert broker.get_progress([id_]) == [None]
    assert broker.get_latest("q", [id_]) == [None]
    assert broker.get_result(id_) is None
    assert decode(broker.get_rate_cuts([id_])[0]) is not None


def test_a_throttled_call_is_put_back_on_its_attempt_and_cuts_its_key(broker_url: str) -> None:
    app = Hurtle(broker_url, heartbeat_timeout=5.0)
    ran: list[tuple[int, int]] = []

    @app.task(name="thr.call", queue=QUEUE, rate_limit="50/s", retries=0)
    def call(n: int) -> None:
        ran.append((n, current().attempt))
        if n == 1 and len(ran) < 3:
            raise Throttle(retry_after=0.05)

    try:
        call.send_many([(0,), (1,)])
        app.worker(burst=True, queues=[QUEUE]).run()
        assert sorted(ran) == [(0, 0), (1, 0), (1, 0)]  # no attempt spent
        stats = app.broker.stats([QUEUE])[QUEUE]
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
        found = decode(app.broker.get_rate_cuts(["thr.call"])[0])
        assert found is not None and found.share == 0.5
    finally:
        app.close()
