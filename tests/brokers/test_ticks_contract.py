"""Conformance of tick claims (``Broker.claim_tick``, ``last_tick``) on every broker.

A claim records a schedule's tick and publishes its messages in one atomic step, only when the
tick was not claimed yet (among the latest ``RECENT_TICKS`` ones kept): of any number of
callers, one wins, and a tick never wins twice. A tick ahead of the broker's clock is refused;
the messages of a ``unique_for`` task take their unique locks in the same step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import pytest

from hurtle.brokers import Broker, Consumer, Delivery, TickClaim
from hurtle.brokers.ticks import RECENT_TICKS, TICK_SKEW
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message

MakeBroker = Callable[..., Broker]


def tick_msg(tick: float, queue: str = "q", **fields: object) -> Message:
    return Message(
        id=new_id(),
        task="tests.tick",
        queue=queue,  # type: ignore[arg-type]
        headers={"tick": tick},
        **fields,
    )


def drain(consumer: Consumer) -> list[Delivery]:
    out: list[Delivery] = []
    while batch := consumer.fetch(100, 0):
        out += batch
    consumer.ack(out)
    return out


def ticks_of(deliveries: list[Delivery]) -> list[float]:
    return [Message.decode(d.raw).headers["tick"] for d in deliveries]


def test_first_claim_of_a_tick_wins_and_publishes(broker: Broker) -> None:
    assert broker.last_tick("q", "s") is None
    assert broker.claim_tick("q", "s", 100.0, [tick_msg(100.0)]).won is True
    assert broker.last_tick("q", "s") == 100.0
    consumer = broker.consumer(["q"])
    assert ticks_of(drain(consumer)) == [100.0]
    consumer.close()


def test_two_callers_claiming_one_tick_publish_it_once(make: MakeBroker) -> None:
    a, b = make(), make()
    assert a.claim_tick("q", "s", 100.0, [tick_msg(100.0)]).won is True
    assert b.claim_tick("q", "s", 100.0, [tick_msg(100.0)]).won is False
    assert a.claim_tick("q", "s", 100.0, [tick_msg(100.0)]).won is False
    consumer = a.consumer(["q"])
    assert ticks_of(drain(consumer)) == [100.0]
    consumer.close()


def test_a_tick_is_claimed_once_even_after_newer_ones(make: MakeBroker) -> None:
    """An older tick no one claimed (its schedulers could not reach the broker while a new one
    claimed the next tick) is still claimed, once; the last tick stays the newest."""
    a, b = make(), make()
    assert a.claim_tick("q", "s", 200.0, [tick_msg(200.0)]).won is True
    assert b.claim_tick("q", "s", 200.0, [tick_msg(200.0)]).won is False
    assert b.claim_tick("q", "s", 199.0, [tick_msg(199.0)]).won is True
    assert a.claim_tick("q", "s", 199.0, [tick_msg(199.0)]).won is False
    assert a.last_tick("q", "s") == 200.0
    assert b.claim_tick("q", "s", 200.5, [tick_msg(200.5)]).won is True
    assert a.last_tick("q", "s") == 200.5
    consumer = a.consumer(["q"])
    assert ticks_of(drain(consumer)) == [200.0, 199.0, 200.5]
    consumer.close()


def test_a_tick_older_than_every_recent_one_kept_is_refused(broker: Broker) -> None:
    """The broker keeps the latest RECENT_TICKS claimed ticks: older than all of them, a tick
    cannot be told apart from one claimed long ago, and is refused."""
    for i in range(RECENT_TICKS):
        assert broker.claim_tick("q", "s", 1000.0 + i, [tick_msg(1000.0 + i)]).won
    assert broker.claim_tick("q", "s", 999.0, [tick_msg(999.0)]).won is False
    assert broker.claim_tick("q", "s", 1000.0, [tick_msg(1000.0)]).won is False
    assert broker.claim_tick("q", "s", 2000.0, [tick_msg(2000.0)]).won is True  # 1000 is let go
    assert broker.claim_tick("q", "s", 1000.5, [tick_msg(1000.5)]).won is False
    assert broker.claim_tick("q", "s", 1001.5, [tick_msg(1001.5)]).won is True
    assert broker.last_tick("q", "s") == 2000.0
    assert broker.stats(["q"])["q"].ready == RECENT_TICKS + 2


def test_many_threads_racing_for_each_tick_publish_each_once(make: MakeBroker) -> None:
    """Eight clients claim the same 30 ticks at once: every tick is published exactly once."""
    brokers = [make() for _ in range(8)]
    ticks = [1000.0 + i for i in range(30)]
    wins: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(brokers))

    def claimer(b: Broker) -> None:
        try:
            for t in ticks:
                barrier.wait(30)  # a claimer that failed breaks it: the others stop too
                if b.claim_tick("q", "s", t, [tick_msg(t)]).won:
                    with lock:
                        wins.append(t)
        except BaseException as err:
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=claimer, args=(b,), daemon=True) for b in brokers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
    assert sorted(wins) == ticks
    consumer = brokers[0].consumer(["q"])
    assert sorted(ticks_of(drain(consumer))) == ticks
    consumer.close()


def test_schedules_are_claimed_independently_per_name_and_queue(broker: Broker) -> None:
    assert broker.claim_tick("q", "a", 100.0, [tick_msg(100.0)]).won is True
    assert broker.claim_tick("q", "b", 100.0, [tick_msg(100.0)]).won is True
    assert broker.claim_tick("r", "a", 100.0, [tick_msg(100.0, queue="r")]).won is True
    assert broker.last_tick("q", "a") == broker.last_tick("r", "a") == 100.0
    assert broker.last_tick("q", "c") is None


def test_a_claim_publishes_delayed_and_prioritised_messages_as_publish_does(
    broker: Broker,
) -> None:
    far = 4_000_000_000.0
    messages = [tick_msg(1.0, priority=9), tick_msg(1.0, eta=far), tick_msg(1.0)]
    assert broker.claim_tick("q", "s", 1.0, messages).won is True
    stats = broker.stats(["q"])["q"]
    assert (stats.ready, stats.delayed) == (2, 1)
    consumer = broker.consumer(["q"])
    first = consumer.fetch(1, 0)
    assert Message.decode(first[0].raw).priority == 9
    consumer.ack(first)
    drain(consumer)
    consumer.close()
    assert "q" in broker.queues()


def test_a_lost_claim_publishes_nothing(make: MakeBroker) -> None:
    a, b = make(), make()
    a.claim_tick("q", "s", 100.0, [tick_msg(100.0)])
    consumer = a.consumer(["q"])
    drain(consumer)
    assert b.claim_tick("q", "s", 100.0, [tick_msg(100.0), tick_msg(100.0)]).won is False
    assert a.stats(["q"])["q"].ready == 0
    consumer.close()


@pytest.mark.parametrize("tick", [float("nan"), float("inf"), "100", True])
def test_a_claim_of_a_tick_that_is_no_time_is_refused(broker: Broker, tick: object) -> None:
    with pytest.raises(ConfigurationError, match="tick"):
        broker.claim_tick("q", "s", tick, [tick_msg(1.0)])  # type: ignore[arg-type]
    assert broker.last_tick("q", "s") is None


def test_a_claim_whose_messages_go_to_another_queue_is_refused(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match="queue"):
        broker.claim_tick("q", "s", 1.0, [tick_msg(1.0, queue="other")])
    with pytest.raises(ConfigurationError, match="at least one message"):
        broker.claim_tick("q", "s", 1.0, [])
    assert broker.last_tick("q", "s") is None
    assert broker.stats(["other"])["other"].ready == 0


# -- the broker's clock ---------------------------------------------------------------------


def test_a_tick_ahead_of_the_brokers_clock_is_refused_and_says_how_early(make: MakeBroker) -> None:
    """A claimer whose clock runs a minute ahead records nothing: the schedulers whose clocks
    are right go on claiming the ticks before it."""
    a, b = make(), make()
    ahead = time.time() + 60.0
    answer = a.claim_tick("q", "s", ahead, [tick_msg(ahead)])
    assert a.last_tick("q", "s") is None
    assert a.stats(["q"])["q"].ready == 0
    assert answer.won is False
    assert 60.0 - 5.0 < answer.early <= 60.0  # by the broker's clock, give or take the call
    now = time.time()
    assert b.claim_tick("q", "s", now, [tick_msg(now)]) == TickClaim(True)
    within = time.time() + TICK_SKEW / 2  # a clock a little ahead is tolerated
    assert b.claim_tick("q", "s", within, [tick_msg(within)]) == TickClaim(True)
    consumer = a.consumer(["q"])
    assert ticks_of(drain(consumer)) == [now, within]
    consumer.close()


# -- unique tasks ---------------------------------------------------------------------------


def unique_msg(tick: float, key: str = "tests.tick:k") -> Message:
    return msgspec.structs.replace(tick_msg(tick), unique=key, unique_until=time.time() + 60)


def test_a_tick_of_a_unique_task_takes_its_lock_and_skips_while_a_call_holds_it(
    make: MakeBroker,
) -> None:
    a, b = make(), make()
    first = unique_msg(100.0)
    assert a.claim_tick("q", "s", 100.0, [first], unique_for=60.0) == TickClaim(True)
    # the next tick is claimed (no one claims it again) but enqueues nothing: the lock is held
    answer = b.claim_tick("q", "s", 101.0, [unique_msg(101.0)], unique_for=60.0)
    assert answer == TickClaim(True, held_by=first.id)
    assert a.last_tick("q", "s") == 101.0
    consumer = a.consumer(["q"])
    deliveries = drain(consumer)
    assert ticks_of(deliveries) == [100.0]
    consumer.release_unique([("q", "tests.tick:k", first.id, first.unique_until)])
    # the lock is free once the call is settled: the next tick runs
    assert b.claim_tick("q", "s", 102.0, [unique_msg(102.0)], unique_for=60.0) == TickClaim(True)
    assert ticks_of(drain(consumer)) == [102.0]
    consumer.close()


def test_a_tick_and_a_send_of_a_unique_task_share_one_lock(broker: Broker) -> None:
    sent = unique_msg(0.0)
    assert broker.publish_unique([sent], 60.0) == [sent.id]
    answer = broker.claim_tick("q", "s", 100.0, [unique_msg(100.0)], unique_for=60.0)
    assert answer == TickClaim(True, held_by=sent.id)
    assert broker.stats(["q"])["q"].ready == 1


def test_a_lost_claim_of_a_unique_task_takes_no_lock(make: MakeBroker) -> None:
    a, b = make(), make()
    assert a.claim_tick("q", "s", 100.0, [unique_msg(100.0, "tests.tick:a")], 60.0).won
    assert not b.claim_tick("q", "s", 100.0, [unique_msg(100.0, "tests.tick:b")], 60.0).won
    other = unique_msg(0.0, "tests.tick:b")
    assert a.publish_unique([other], 60.0) == [other.id]  # lock b was left free


@pytest.mark.parametrize("unique_for", [0, -1.0, float("nan"), "60", True])
def test_a_tick_claim_with_a_bad_unique_for_is_refused(broker: Broker, unique_for: object) -> None:
    with pytest.raises(ConfigurationError, match="unique_for"):
        broker.claim_tick("q", "s", 1.0, [unique_msg(1.0)], unique_for)  # type: ignore[arg-type]
    assert broker.last_tick("q", "s") is None
