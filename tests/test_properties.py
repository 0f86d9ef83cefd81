"""Property-based tests (hypothesis): message decoding on mutated bytes, and the broker contract
as a state machine on every broker.

Decoding: whatever bytes a broker hands over, ``Message.decode`` returns a ``Message`` or raises
``DecodeError`` (which sends them to the dead letters); nothing else escapes, since anything else
would kill the worker. A message it returns carries only values hurtle can act on.

The contract: publish, fetch, ack, retry, dead-letter, release, close, a consumer that dies and
is recovered, and the dead consumer settling what it held after all, in random order. A model
records where each message id is — ready or delayed, held by one consumer, dead, or done — and
after every step the broker must agree: the counts of ``stats``, the ids of the dead letters, and
what each fetch returns (only ready messages, as many as asked for while there are). At any
moment every message is in exactly one of those places: never lost, never twice.
"""

from __future__ import annotations

import collections
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, example, given, reject, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hurtle.brokers import Consumer, Delivery, make_broker
from hurtle.errors import DecodeError
from hurtle.ids import new_id
from hurtle.message import MAX_PRIORITY, MIN_PRIORITY, Message

# -- decoding ----------------------------------------------------------------------------------

#: Shrinking replays a failing case hundreds of times: minutes for the state machine, whose
#: dead consumers wait out the heartbeat timeout, and for decoding, whose recursion failures
#: depend on the stack depth at the call. By default a failure is reported as found;
#: ``HURTLE_PROPERTIES_SHRINK=1`` shrinks it first.
PHASES = [p for p in Phase if p is not Phase.shrink or os.environ.get("HURTLE_PROPERTIES_SHRINK")]

_encode = msgspec.msgpack.encode

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)

messages = st.builds(
    Message,
    id=st.text(max_size=24),
    task=st.text(max_size=16),
    queue=st.text(max_size=8),
    args=st.lists(plain, max_size=3).map(tuple),
    kwargs=st.dictionaries(st.text(max_size=4), plain, max_size=3),
    attempt=st.integers(min_value=0, max_value=50),
    priority=st.integers(min_value=MIN_PRIORITY, max_value=MAX_PRIORITY),
    eta=st.floats(min_value=0, max_value=4e9),
    created=st.floats(min_value=0, max_value=4e9),
    headers=st.dictionaries(st.text(max_size=4), plain, max_size=2),
)


def _nested(depth: int) -> bytes:
    """A msgpack value nested ``depth`` lists deep."""
    return b"\x91" * depth + b"\xc0"


#: Things to insert: any plain value's encoding, or a deeply nested one.
insertions = plain.map(_encode) | (
    st.sampled_from([1000, 3000, 10_000]) | st.integers(min_value=1, max_value=5000)
).map(_nested)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message's bytes after random byte flips, truncations and insertions."""
    raw = bytearray(draw(messages).encode())
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "replace"]))
        at = draw(st.integers(min_value=0, max_value=len(raw)))
        if kind == "flip" and raw:
            i = min(at, len(raw) - 1)
            raw[i] ^= draw(st.integers(min_value=1, max_value=255))
        elif kind == "truncate":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = draw(insertions)
        else:  # one encoded value in place of the bytes that follow
            raw[at:] = draw(insertions)
    return bytes(raw)


@st.composite
def spliced(draw: st.DrawFn) -> bytes:
    """A message's array with one field's encoding replaced by another encoded value (a list
    nested thousands deep, a string for a number...): framed right, so decoding reaches it."""
    m = draw(messages)
    chunks = [_encode(getattr(m, name)) for name in m.__struct_fields__]
    # which field: often args, kwargs or headers, the ones that hold nested values
    i = draw(st.sampled_from([3, 4, 9]) | st.integers(min_value=0, max_value=len(chunks) - 1))
    n = draw(st.integers(min_value=i + 1, max_value=len(chunks)))  # the rest take defaults
    chunks = chunks[:n]
    chunks[i] = draw(insertions)
    return bytes([0x90 | n]) + b"".join(chunks)


@settings(max_examples=300, deadline=None, phases=PHASES)
@given(raw=mutated() | spliced() | st.binary(max_size=64))
def test_decode_of_any_bytes_returns_a_message_or_raises_decode_error(raw: bytes) -> None:
    try:
        decoded = Message.decode(raw)
    except DecodeError:
        return
    assert isinstance(decoded, Message)


@pytest.mark.parametrize("depth", [1000, 5000])
def test_decode_of_arguments_nested_thousands_deep_raises_decode_error(depth: int) -> None:
    raw = b"\x94" + _encode("id") + _encode("task") + _encode("q") + _nested(depth)
    with pytest.raises(DecodeError):
        Message.decode(raw)


@settings(max_examples=300, deadline=None, phases=PHASES)
@given(raw=mutated() | spliced())
@example(raw=Message(id="a", task="t", queue="q", priority=42).encode())
@example(raw=Message(id="a", task="t", queue="q", priority=-1).encode())
def test_a_decoded_message_has_a_priority_from_0_to_9_and_a_nonnegative_attempt(
    raw: bytes,
) -> None:
    try:
        decoded = Message.decode(raw)
    except DecodeError:
        return
    assert type(decoded.priority) is int
    assert MIN_PRIORITY <= decoded.priority <= MAX_PRIORITY, decoded.priority
    assert decoded.attempt >= 0, decoded.attempt


@settings(max_examples=100, deadline=None, phases=PHASES)
@given(message=messages)
def test_encode_then_decode_gives_the_same_message(message: Message) -> None:
    assert Message.decode(message.encode()).encode() == message.encode()


# -- the broker contract as a state machine ---------------------------------------------------

#: Heartbeat timeout of every client: a consumer that stops beating is recovered after this.
#: Live consumers beat before every step, far more often.
TIMEOUT = 0.15
SLOTS = 2  # consumers that may be alive at once
QUEUE = "q"
FAR = 3600.0  # delayed messages are due in an hour: never during a test
SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def stall_proof(step: Callable[..., None]) -> Callable[..., None]:
    """A step whose check fails while a live consumer has not beaten for nearly ``TIMEOUT`` is
    rejected, not failed: the machine stalled (a loaded host) long enough for the broker to take
    a live consumer for dead, which the model does not predict. On a machine that keeps up, no
    step comes near it, and every failure is reported."""

    @functools.wraps(step)
    def checked(self: BrokerContract, *args: Any, **kwargs: Any) -> None:
        try:
            step(self, *args, **kwargs)
        except AssertionError:
            now = time.monotonic()
            live = [s for s, c in enumerate(self.consumers) if c is not None]
            if any(now - self.beaten[s] > TIMEOUT * 0.8 for s in live):
                reject()
            raise

    return checked


class _Stores:
    """The clients of one store: a producer, one per consumer slot, and an inspector.

    Each is a separate broker object (another process, in effect), but for ``memory://``,
    where every client is the one broker.
    """

    def __init__(self, url: str) -> None:
        self.dir: Path | None = None
        if url == "sqlite":
            self.dir = Path(tempfile.mkdtemp(prefix="hurtle-props-"))
            url = f"sqlite:///{self.dir / 'hurtle.db'}"
        elif url.startswith("redis"):
            import redis

            client = redis.Redis.from_url(url)
            client.flushall()
            client.close()
        if url.startswith("memory"):
            one = make_broker(url, heartbeat_timeout=TIMEOUT)
            self.all = [one] * (SLOTS + 2)
        else:
            self.all = [make_broker(url, heartbeat_timeout=TIMEOUT) for _ in range(SLOTS + 2)]
        self.producer, self.inspector, *self.slots = self.all

    def close(self) -> None:
        for b in {id(b): b for b in self.all}.values():
            b.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def _id(delivery: Delivery) -> str:
    return Message.decode(delivery.raw).id


class BrokerContract(RuleBasedStateMachine):
    """The model: ``where[id]`` is ``"ready"``, ``"delayed"``, ``"dead"``, ``"done"`` or the
    slot (an int) of the consumer holding it."""

    url = "memory://"

    def __init__(self) -> None:
        super().__init__()
        self.stores = _Stores(self.url)
        self.where: dict[str, str | int] = {}
        self.messages: dict[str, Message] = {}
        self.consumers: list[Consumer | None] = [None] * SLOTS
        self.held: list[dict[str, Delivery]] = [{} for _ in range(SLOTS)]
        self.beaten = [0.0] * SLOTS  # when each live consumer last told the broker it lives
        # (consumer, delivery, id) held by consumers declared dead: what a zombie may settle
        self.stale: list[tuple[Consumer, Delivery, str]] = []
        self.deaths = 0

    def teardown(self) -> None:
        self.stores.close()

    # -- helpers ---------------------------------------------------------------------------

    def _beat(self) -> None:
        for slot, c in enumerate(self.consumers):
            if c is not None:
                c.heartbeat()
                self.beaten[slot] = time.monotonic()

    def _count(self, state: str | int) -> int:
        return sum(1 for w in self.where.values() if w == state)

    def _live(self) -> list[int]:
        return [s for s, c in enumerate(self.consumers) if c is not None]

    def _holding(self) -> list[int]:
        return [s for s in self._live() if self.held[s]]

    @initialize()
    @stall_proof
    def a_consumer_holds_messages(self) -> None:
        """Every run starts with deliveries held, so that a consumer can die holding them from
        the first step."""
        self.publish([(0, "now"), (5, "now"), (9, "now")])
        self.start_consumer()
        c = self.consumers[0]
        assert c is not None
        self._take(0, c.fetch(2, 0), 2, 3)

    # -- producing -------------------------------------------------------------------------

    @rule(
        specs=st.lists(
            st.tuples(st.integers(0, MAX_PRIORITY), st.sampled_from(["now", "past", "later"])),
            min_size=1,
            max_size=6,
        )
    )
    @stall_proof
    def publish(self, specs: list[tuple[int, str]]) -> None:
        self._beat()
        now = time.time()
        batch = []
        for priority, when in specs:
            eta = {"now": 0.0, "past": now - 5, "later": now + FAR}[when]
            m = Message(id=new_id(), task="t", queue=QUEUE, priority=priority, eta=eta)
            batch.append(m)
        self.stores.producer.publish(batch)
        for m in batch:
            self.messages[m.id] = m
            self.where[m.id] = "delayed" if m.eta > now else "ready"

    # -- consuming -------------------------------------------------------------------------

    @precondition(lambda self: None in self.consumers)
    @rule()
    @stall_proof
    def start_consumer(self) -> None:
        self._beat()
        slot = self.consumers.index(None)
        self.consumers[slot] = self.stores.slots[slot].consumer([QUEUE], f"w{slot}-{new_id()}")
        self.consumers[slot].heartbeat()  # type: ignore[union-attr]
        self.beaten[slot] = time.monotonic()

    def _take(self, slot: int, got: list[Delivery], wanted: int, ready_before: int) -> None:
        ids = [_id(d) for d in got]
        assert len(ids) == len(set(ids)), f"one fetch returned a message twice: {ids}"
        for i in ids:
            assert self.where.get(i) == "ready", f"fetched {i}, which is {self.where.get(i)!r}"
        assert len(got) == min(wanted, ready_before), (
            f"asked for {wanted} with {ready_before} ready, got {len(got)}"
        )
        for i, d in zip(ids, got, strict=True):
            self.where[i] = slot
            self.held[slot][i] = d

    @precondition(lambda self: any(c is not None for c in self.consumers))
    @rule(data=st.data(), wanted=st.integers(1, 6))
    @stall_proof
    def fetch(self, data: st.DataObject, wanted: int) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._live()))
        c = self.consumers[slot]
        assert c is not None
        ready = self._count("ready")
        self._take(slot, c.fetch(wanted, 0), wanted, ready)

    @precondition(
        lambda self: any(
            c is not None and h for c, h in zip(self.consumers, self.held, strict=True)
        )
    )
    @rule(data=st.data())
    @stall_proof
    def ack(self, data: st.DataObject) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._holding()))
        ids = data.draw(st.lists(st.sampled_from(sorted(self.held[slot])), min_size=1, unique=True))
        c = self.consumers[slot]
        assert c is not None
        c.ack([self.held[slot].pop(i) for i in ids])
        for i in ids:
            self.where[i] = "done"

    @precondition(
        lambda self: any(
            c is not None and h for c, h in zip(self.consumers, self.held, strict=True)
        )
    )
    @rule(data=st.data(), wanted=st.integers(1, 6))
    @stall_proof
    def ack_and_fetch(self, data: st.DataObject, wanted: int) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._holding()))
        ids = data.draw(st.lists(st.sampled_from(sorted(self.held[slot])), unique=True))
        c = self.consumers[slot]
        assert c is not None
        acked = [self.held[slot].pop(i) for i in ids]
        for i in ids:
            self.where[i] = "done"
        ready = self._count("ready")
        self._take(slot, c.ack_and_fetch(acked, wanted, 0), wanted, ready)

    @precondition(
        lambda self: any(
            c is not None and h for c, h in zip(self.consumers, self.held, strict=True)
        )
    )
    @rule(data=st.data(), later=st.booleans(), priority=st.integers(0, MAX_PRIORITY))
    @stall_proof
    def retry(self, data: st.DataObject, later: bool, priority: int) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._holding()))
        i = data.draw(st.sampled_from(sorted(self.held[slot])))
        m = self.messages[i]
        eta = time.time() + FAR if later else 0.0
        nxt = msgspec.structs.replace(m, attempt=m.attempt + 1, eta=eta, priority=priority)
        c = self.consumers[slot]
        assert c is not None
        c.retry(self.held[slot].pop(i), nxt)
        self.messages[i] = nxt
        self.where[i] = "delayed" if later else "ready"

    @precondition(
        lambda self: any(
            c is not None and h for c, h in zip(self.consumers, self.held, strict=True)
        )
    )
    @rule(data=st.data())
    @stall_proof
    def dead_letter(self, data: st.DataObject) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._holding()))
        i = data.draw(st.sampled_from(sorted(self.held[slot])))
        c = self.consumers[slot]
        assert c is not None
        c.dead_letter(self.held[slot].pop(i), "a reason")
        self.where[i] = "dead"

    @precondition(
        lambda self: any(
            c is not None and h for c, h in zip(self.consumers, self.held, strict=True)
        )
    )
    @rule(data=st.data())
    @stall_proof
    def release(self, data: st.DataObject) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._holding()))
        ids = data.draw(st.lists(st.sampled_from(sorted(self.held[slot])), min_size=1, unique=True))
        c = self.consumers[slot]
        assert c is not None
        c.release([self.held[slot].pop(i) for i in ids])
        for i in ids:
            self.where[i] = "ready"

    @precondition(lambda self: any(c is not None for c in self.consumers))
    @rule(data=st.data())
    @stall_proof
    def close(self, data: st.DataObject) -> None:
        self._beat()
        slot = data.draw(st.sampled_from(self._live()))
        c = self.consumers[slot]
        assert c is not None
        c.close()
        for i in self.held[slot]:
            self.where[i] = "ready"
        self.held[slot] = {}
        self.consumers[slot] = None

    # -- a consumer dies, and comes back as a zombie ---------------------------------------

    @precondition(lambda self: self.deaths == 0 and any(h for h in self.held))
    @rule(data=st.data())
    @stall_proof
    def consumer_dies_and_is_recovered(self, data: st.DataObject) -> None:
        """It stops beating while it holds deliveries; once its silence outlasts the timeout,
        recovery hands back all it held. The others beat meanwhile, as live workers do. (At most
        one death per run: each waits out the timeout.)"""
        self._beat()
        slot = data.draw(st.sampled_from(self._holding()))
        dead = self.consumers[slot]
        assert dead is not None
        self.consumers[slot] = None
        self.deaths += 1
        silent_since = self.beaten[slot]
        while time.monotonic() - silent_since < TIMEOUT * 1.5:
            self._beat()
            time.sleep(TIMEOUT / 8)
        self._beat()  # a live consumer's beat recovers it; else an admin's recover() does
        recovered = self.stores.producer.recover()
        if not self._live():
            assert recovered == len(self.held[slot]), (recovered, len(self.held[slot]))
        for i, d in self.held[slot].items():
            self.where[i] = "ready"
            self.stale.append((dead, d, i))
        self.held[slot] = {}
        # It comes back and settles some of what it held at once (the rest maybe later, after
        # others took those messages), each delivery one way or another.
        for _ in range(data.draw(st.integers(1, len(self.stale)))):
            self._zombie_settles(data, len(self.stale) - 1)

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data(), how=st.sampled_from(["ack", "retry", "dead_letter", "release"]))
    @stall_proof
    def zombie_settles_what_it_held(self, data: st.DataObject, how: str) -> None:
        """A consumer declared dead settles a delivery that went back to the queue: the message
        stays where it is now (ready, or held by another consumer), and only there."""
        self._beat()
        self._zombie_settles(data, data.draw(st.integers(0, len(self.stale) - 1)), how)

    def _zombie_settles(self, data: st.DataObject, k: int, how: str | None = None) -> None:
        if how is None:
            how = data.draw(st.sampled_from(["retry", "dead_letter", "ack", "release"]))
        zombie, delivery, i = self.stale.pop(k)
        if how == "ack":
            zombie.ack([delivery])
        elif how == "retry":
            m = self.messages[i]
            zombie.retry(delivery, msgspec.structs.replace(m, attempt=m.attempt + 1))
        elif how == "dead_letter":
            zombie.dead_letter(delivery, "too late")
        else:
            zombie.release([delivery])

    # -- looking -------------------------------------------------------------------------------

    @rule()
    @stall_proof
    def inspect_what_is_ready(self) -> None:
        """Take everything ready with a separate consumer, compare ids, and give it back."""
        self._beat()
        c = self.stores.inspector.consumer([QUEUE], f"inspector-{new_id()}")
        got: list[Delivery] = []
        while batch := c.fetch(100, 0):
            got += batch
        ids = collections.Counter(_id(d) for d in got)
        c.release(got)
        c.close()
        expected = collections.Counter(i for i, w in self.where.items() if w == "ready")
        assert ids == expected, f"ready: broker has {ids}, model has {expected}"

    @invariant()
    @stall_proof
    def every_message_is_in_exactly_one_place(self) -> None:
        stats = self.stores.producer.stats([QUEUE])[QUEUE]
        in_flight = sum(self._count(s) for s in range(SLOTS))
        model = (self._count("ready"), self._count("delayed"), in_flight, self._count("dead"))
        actual = (stats.ready, stats.delayed, stats.in_flight, stats.dead)
        assert actual == model, f"(ready, delayed, in flight, dead): {actual}, model {model}"
        dead = collections.Counter(
            d.message().id if d.message() else "?"  # type: ignore[union-attr]
            for d in self.stores.producer.dead_letters(QUEUE, limit=1000)
        )
        expected = collections.Counter(i for i, w in self.where.items() if w == "dead")
        assert dead == expected, f"dead letters: broker has {dead}, model has {expected}"


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    kind = request.param
    if kind == "redis":
        yield str(request.getfixturevalue("redis_url"))
    else:
        yield {"memory": "memory://", "sqlite": "sqlite"}[kind]


def test_broker_contract_holds_in_any_order_of_operations(store_url: str) -> None:
    machine: Any = type("BrokerContractOn", (BrokerContract,), {"url": store_url})
    run_state_machine_as_test(machine, settings=SETTINGS)
