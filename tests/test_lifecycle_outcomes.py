"""Every delivery ends in an outcome, whatever it holds: unprintable exceptions, payloads that
break the decoder, calls that cannot bind, outcomes the broker refuses, and a hard stop landing
between a task and its bookkeeping (memory broker, in-process)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence

import msgspec
import pytest

from hurtle import Hurtle, Message, TaskFailed, group
from hurtle.brokers import Consumer, Delivery, FlowStep, Lock, StoredResult
from hurtle.errors import EncodeError
from hurtle.message import lock_of
from hurtle.worker import worker as worker_module
from hurtle.worker.acker import Acker
from hurtle.worker.processor import Processor
from hurtle.worker.worker import Worker

POOLS = ["solo", "threads"]


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ raised")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ raised")


def deep_payload(depth: int = 3000) -> bytes:
    """A message whose one argument is a list nested ``depth`` deep (too deep to decode)."""
    raw = Message(id="deep", task="plain", queue="default", args=("@@@@@@@@",)).encode()
    return raw.replace(b"\xa8@@@@@@@@", b"\x91" * (depth - 1) + b"\x90")


def run_burst(worker: Worker, timeout: float = 30) -> None:
    """Run a burst worker; fail (instead of hanging) if it does not end."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not errors, f"the worker died: {errors[0]!r}"
    assert not thread.is_alive(), "the burst worker never finished: a delivery stayed in flight"


def stats(app: Hurtle) -> tuple[int, int, int]:
    s = app.broker.stats(["default"])["default"]
    return s.ready, s.in_flight, s.dead


@pytest.mark.parametrize("pool", POOLS)
def test_an_exception_that_cannot_be_printed_is_retried_then_dead_lettered(
    app: Hurtle, pool: str
) -> None:
    calls: list[int] = []
    ran: list[int] = []

    @app.task(retries=1, retry_delay=0.01)
    def unprintable(i: int) -> None:
        calls.append(i)
        raise Unprintable()

    @app.task
    def plain(i: int) -> None:
        ran.append(i)

    unprintable.send(1)
    plain.send_many([(i,) for i in range(5)])
    run_burst(app.worker(pool=pool, concurrency=2, burst=True))
    assert calls == [1, 1]  # the attempt counted: a retry, then the dead letter
    assert sorted(ran) == list(range(5))
    (dead,) = app.broker.dead_letters("default")
    assert "failed on attempt 2 of 2" in dead.reason and "raise Unprintable()" in dead.reason
    message = dead.message()
    assert message is not None
    assert message.headers["error"] == "Unprintable: <unprintable Unprintable>"
    assert stats(app) == (0, 0, 1)


@pytest.mark.parametrize("pool", POOLS)
def test_a_payload_too_deep_to_decode_is_dead_lettered_and_the_worker_carries_on(
    app: Hurtle, pool: str
) -> None:
    ran: list[int] = []

    @app.task
    def plain(i: int) -> None:
        ran.append(i)

    app.broker.publish_raw("default", [deep_payload()])
    plain.send_many([(i,) for i in range(3)])
    run_burst(app.worker(pool=pool, concurrency=2, burst=True))
    assert sorted(ran) == [0, 1, 2]
    (dead,) = app.broker.dead_letters("default")
    assert dead.reason.startswith("undecodable message")
    assert dead.raw == deep_payload()
    assert stats(app) == (0, 0, 1)


def test_an_item_whose_handling_fails_in_the_threads_pool_still_gets_an_outcome(
    app: Hurtle,
) -> None:
    # the last resort of every pooled runner: whatever escapes the processor is dead-lettered
    from hurtle.worker.executors.runners import RunnerPool

    outcomes: list[tuple[str, str]] = []
    done = threading.Event()

    def work(item: str) -> None:
        raise RuntimeError(f"cannot handle {item}")

    def on_error(item: str, err: BaseException) -> None:
        outcomes.append((item, str(err)))
        done.set()

    pool: RunnerPool[str] = RunnerPool(work, max_size=1, on_error=on_error)
    pool.start()
    pool.submit(["x"])
    assert done.wait(10)
    assert pool.join(10)
    assert outcomes == [("x", "cannot handle x")]
    pool.stop()


@pytest.mark.parametrize("pool", POOLS)
def test_a_call_that_cannot_bind_is_dead_lettered_at_once_without_retries(
    app: Hurtle, pool: str
) -> None:
    ran: list[int] = []

    @app.task(retries=3, retry_delay=0.01)
    def add(x: int, y: int) -> int:
        ran.append(x)
        return x + y

    app.broker.publish([Message(id="m1", task=add.name, queue="default", args=(1, 2, 3))])
    run_burst(app.worker(pool=pool, concurrency=2, burst=True))
    assert ran == []
    (dead,) = app.broker.dead_letters("default")
    assert f"task {add.name} cannot be called with the arguments" in dead.reason
    assert "too many positional arguments" in dead.reason
    assert "(x: 'int', y: 'int')" in dead.reason  # the signature to match
    message = dead.message()
    assert message is not None and message.attempt == 0  # never retried


def test_a_type_error_raised_inside_a_task_is_still_retried(app: Hurtle) -> None:
    calls: list[int] = []

    @app.task(retries=2, retry_delay=0.01)
    def inner(x: int) -> None:
        calls.append(x)
        raise TypeError("the task's own type error")

    inner.send(1)
    run_burst(app.worker(burst=True))
    assert calls == [1, 1, 1]
    (dead,) = app.broker.dead_letters("default")
    assert "failed on attempt 3 of 3" in dead.reason


# -- outcomes the broker refuses -------------------------------------------------------------


class RefusingConsumer(Consumer):
    """A real memory consumer that refuses, for their content, the deliveries named ``bad``."""

    def __init__(self, inner: Consumer, bad: set[bytes], *, dead_too: bool = False) -> None:
        self.inner = inner
        self.bad = bad
        self.dead_too = dead_too
        self.worker_id = inner.worker_id
        self.queues = inner.queues

    def _check(self, delivery: Delivery) -> None:
        if delivery.raw in self.bad:
            raise EncodeError("priority 12 of task 't' is out of range")

    def fetch(self, max_count: int, timeout: float) -> list[Delivery]:
        return self.inner.fetch(max_count, timeout)

    def ack(self, deliveries: Sequence[Delivery], results: Sequence[StoredResult] = ()) -> None:
        for d in deliveries:
            self._check(d)
        self.inner.ack(deliveries, results)

    def release_unique(self, locks: Sequence[Lock]) -> None:
        self.inner.release_unique(locks)

    def retry(self, delivery: Delivery, message: Message) -> None:
        self._check(delivery)
        self.inner.retry(delivery, message)

    def ack_flow(self, steps: Sequence[FlowStep]) -> None:
        for step in steps:
            self._check(step.delivery)
        self.inner.ack_flow(steps)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        if self.dead_too:
            self._check(delivery)
        self.inner.dead_letter(delivery, reason)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        self.inner.release(deliveries)

    def heartbeat(self) -> None:
        self.inner.heartbeat()

    def close(self) -> None:
        self.inner.close()


def _held(app: Hurtle, n: int) -> tuple[Consumer, list[Delivery]]:
    app.broker.publish(
        [Message(id=f"m{i}", task="t", queue="default", args=(i,)) for i in range(n)]
    )
    consumer = app.broker.consumer(["default"], "w1")
    held = consumer.fetch(n, 1.0)
    assert len(held) == n
    return consumer, held


def test_a_retry_the_broker_refuses_goes_to_the_dead_letters_and_blocks_nothing(
    app: Hurtle,
) -> None:
    inner, (bad, good, other) = _held(app, 3)
    acker = Acker(RefusingConsumer(inner, {bad.raw}))
    message = Message.decode(bad.raw)
    acker.retry(
        bad,
        Message(
            id=message.id,
            task="t",
            queue="default",
            attempt=1,
            headers={"error": "ValueError: boom"},
        ),
    )
    acker.ack(good)
    acker.retry(other, Message(id="m2", task="t", queue="default", attempt=1))
    assert acker.flush()
    assert acker.pending == 0
    (dead,) = app.broker.dead_letters("default")
    assert dead.raw == bad.raw
    assert "refused to schedule the retry" in dead.reason and "out of range" in dead.reason
    assert "ValueError: boom" in dead.reason
    assert stats(app) == (1, 0, 1)  # the other retry is ready again, nothing is held


def test_an_outcome_refused_even_as_a_dead_letter_is_dropped_with_an_error(
    app: Hurtle, caplog: pytest.LogCaptureFixture
) -> None:
    inner, (bad, good) = _held(app, 2)
    acker = Acker(RefusingConsumer(inner, {bad.raw}, dead_too=True))
    acker.retry(bad, Message(id="m0", task="t", queue="default", attempt=1))
    acker.ack(good)
    assert acker.flush()  # nothing left to try: the good one settled, the bad one given up
    assert acker.pending == 0 and acker.dropped == 1
    assert "giving up on them" in caplog.text
    assert stats(app) == (0, 1, 0)  # still held by this worker: never lost...
    inner.close()
    assert stats(app) == (1, 0, 0)  # ...it goes back when the worker's session closes


def test_an_acknowledgement_refused_for_one_delivery_does_not_block_the_batch(
    app: Hurtle,
) -> None:
    inner, held = _held(app, 5)
    acker = Acker(RefusingConsumer(inner, {held[2].raw}))
    acker.ack_many(held)
    assert acker.flush()
    assert acker.pending == 0 and acker.dropped == 1
    assert stats(app) == (0, 1, 0)


def test_a_workflow_step_refused_for_one_delivery_does_not_block_the_others(
    app: Hurtle, caplog: pytest.LogCaptureFixture
) -> None:
    inner, held = _held(app, 4)
    acker = Acker(RefusingConsumer(inner, {held[1].raw}))
    for delivery in held:
        acker.ack_flow(FlowStep(delivery))
    assert acker.flush()
    assert acker.pending == 0 and acker.dropped == 1 and acker.settled == 3
    assert "refused to acknowledge a workflow step" in caplog.text
    assert stats(app) == (0, 1, 0)  # the refused one is still held: it runs again later


def test_a_retry_the_broker_refuses_ends_its_record_its_workflow_and_its_lock(
    app: Hurtle,
) -> None:
    """The retry becomes a dead letter in the acker: what waits on its message ends as on
    every other road (the worker's ``ends``)."""

    @app.task(name="keep", store_result=True, retries=1)
    def keep() -> None: ...

    @app.task(name="solo", unique_for=600, retries=1)
    def solo() -> None: ...

    @app.task(name="member", retries=1)
    def member() -> None: ...

    kept, locked, flow = keep.send(), solo.send(), group(member.s()).send().handles[0]
    inner = app.broker.consumer(["default"], "w1")
    held = inner.fetch(3, 1.0)
    assert len(held) == 3
    acker = Acker(RefusingConsumer(inner, {d.raw for d in held}))
    acker.ends = Processor(app, acker).ends_of
    for d in held:
        m = Message.decode(d.raw)
        acker.retry(d, msgspec.structs.replace(m, attempt=1, headers={**m.headers, "error": "E"}))
    assert acker.flush()
    assert stats(app) == (0, 0, 3)
    for h in (kept, flow):
        with pytest.raises(TaskFailed, match="refused to schedule the retry") as info:
            h.result(timeout=5)
        assert info.value.type == "DeadLetter" and h.state() == "dead"
    assert solo.send().id != locked.id  # its lock ended with it: the call is enqueued again


# -- a hard stop between a task and its bookkeeping ------------------------------------------


@pytest.fixture
def main_thread_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_second_signal_right_after_an_outcome_never_hands_that_delivery_back(
    app: Hurtle, monkeypatch: pytest.MonkeyPatch, main_thread_signals: None
) -> None:
    ran: list[int] = []

    class SignalledAcker(Acker):
        """Both signals arrive the moment the first outcome is recorded."""

        def ack(self, delivery: Delivery) -> None:
            super().ack(delivery)
            if not ran[1:]:
                signal.raise_signal(signal.SIGTERM)
                signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(worker_module, "Acker", SignalledAcker)

    @app.task
    async def step(i: int) -> None:  # takes the processor's full path (Processor.run)
        ran.append(i)

    step.send_many([(i,) for i in range(3)])
    worker = app.worker()
    worker.install_signal_handlers()
    worker.run()  # on the main thread, where the hard stop raises in the task
    assert ran == [0]
    assert stats(app) == (2, 0, 0)  # the first is done for good; the two others went back


def test_the_acker_retries_an_unreachable_broker_but_not_a_refusal() -> None:
    import sqlite3

    from hurtle.errors import BrokerError
    from hurtle.worker.refusals import unreachable

    def wrapped(cause: BaseException) -> BrokerError:
        try:
            raise BrokerError("the broker failed") from cause
        except BrokerError as err:
            return err

    assert unreachable(wrapped(ConnectionRefusedError(111, "refused")))
    assert unreachable(wrapped(sqlite3.OperationalError("database is locked")))
    assert not unreachable(wrapped(sqlite3.InterfaceError("bad parameter")))
    assert not unreachable(BrokerError("the SQLite broker is closed"))
    assert not unreachable(EncodeError("priority 12 is out of range"))
    redis = pytest.importorskip("redis")
    assert unreachable(wrapped(redis.ConnectionError("Connection closed by server.")))
    assert unreachable(wrapped(redis.TimeoutError("Timeout reading from socket")))
    assert unreachable(wrapped(redis.BusyLoadingError("Redis is loading the dataset")))
    assert not unreachable(wrapped(redis.ResponseError("ERR Error running script")))


class LockWatchingConsumer(RefusingConsumer):
    """A real memory consumer that, as each dead letter is written, asks whether the call's
    unique lock still holds: by sending the same call again, as a user would."""

    def __init__(self, inner: Consumer, send_again: Callable[[], str]) -> None:
        super().__init__(inner, set())
        self.send_again = send_again
        self.lock_free_at_dead_letter: list[bool] = []
        self.first_id = ""

    def _look(self) -> None:
        self.lock_free_at_dead_letter.append(self.send_again() != self.first_id)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._look()
        self.inner.dead_letter(delivery, reason)

    def dead_letter_many(self, items: Sequence[tuple[Delivery, str]]) -> None:
        self._look()
        self.inner.dead_letter_many(items)


@pytest.mark.parametrize("one_by_one", [True, False])
def test_a_dead_letters_unique_lock_has_ended_when_the_dead_letter_is_written(
    app: Hurtle, one_by_one: bool
) -> None:
    # no one may see a dead letter whose call, sent again, still finds the old lock
    @app.task(name="once", unique_for=60, retries=0)
    def once(x: int) -> None: ...

    first = once.send(1)
    inner = app.broker.consumer(["default"], "w-locks")
    watching = LockWatchingConsumer(inner, lambda: once.send(1).id)
    watching.first_id = first.id
    [delivery] = inner.fetch(10, 1.0)
    acker = Acker(watching)
    message = Message.decode(delivery.raw)
    lock = lock_of(message)
    assert lock is not None
    acker.end_unique("default", lock[0], message.id, lock[1])
    if one_by_one:
        acker.dead_letter(delivery, "failed for good")
    else:
        acker.dead_letter_many([(delivery, "expired")])
    assert acker.flush()
    assert watching.lock_free_at_dead_letter == [True]
    assert len(app.broker.dead_letters("default")) == 1
