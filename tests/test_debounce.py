"""``debounce=`` and ``debounce_key=``: checked once, at registration (and ``options``), with
errors that name the value; what a call carries (its key, its eta); where debounce is refused.
The runs on every broker are in ``tests/brokers/test_debounce_contract.py``."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from hurtle import ConfigurationError, Hurtle, chain
from hurtle.debounce import DEBOUNCE, latest_name


def app() -> Hurtle:
    return Hurtle("memory://")


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf, "5", True, 10**400])
def test_debounce_must_be_finite_seconds_above_zero(seconds: Any) -> None:
    with pytest.raises(ConfigurationError, match="debounce must be a finite number of seconds"):
        app().task(name="t.x", debounce=seconds)(lambda x: x)


def test_debounce_key_must_name_a_parameter() -> None:
    a = app()
    with pytest.raises(ConfigurationError, match=r"debounce_key='user' is not one of its param"):
        a.task(name="t.x", debounce=5, debounce_key="user")(lambda user_id, n: n)
    with pytest.raises(ConfigurationError, match="is not one of its parameters"):

        @a.task(name="t.y", debounce=5, debounce_key="rest")
        def y(*rest: int) -> None: ...


def test_debounce_key_must_be_a_name_or_a_callable() -> None:
    with pytest.raises(ConfigurationError, match="debounce_key must be the name"):
        app().task(name="t.x", debounce=5, debounce_key=3)(lambda x: x)  # type: ignore[arg-type]


def test_debounce_key_needs_debounce() -> None:
    with pytest.raises(ConfigurationError, match="debounce_key needs debounce"):
        app().task(name="t.x", debounce_key="x")(lambda x: x)


def test_a_call_names_its_key_and_waits_out_the_window() -> None:
    a = app()

    @a.task(name="t.by_name", debounce=5, debounce_key="user_id")
    def by_name(n: int, user_id: int = 7, *, flag: bool = False) -> None: ...

    @a.task(name="t.by_fn", debounce=2, debounce_key=lambda n, **kw: n % 2)
    def by_fn(n: int, **kw: Any) -> None: ...

    @a.task(name="t.shared", debounce=1)
    def shared(n: int) -> None: ...

    before = time.time()
    assert by_name.message((1, 3), {}).headers[DEBOUNCE] == "t.by_name:3"
    assert by_name.message((1,), {"user_id": 4}).headers[DEBOUNCE] == "t.by_name:4"
    assert by_name.message((1,), {}).headers[DEBOUNCE] == "t.by_name:7"  # its default
    assert by_fn.message((5,), {}).headers[DEBOUNCE] == "t.by_fn:1"
    assert shared.message((5,), {}).headers[DEBOUNCE] == "t.shared"
    m = by_name.message((1, 3), {})
    assert m.eta >= before + 5 and m.eta - m.created == pytest.approx(5)
    # options(debounce=...) sets this call's window; a later eta is kept
    m = by_name.message((1,), {}, by_name.options(debounce=30).opts)
    assert m.eta - m.created == pytest.approx(30)
    m = by_name.message((1,), {}, by_name.options(delay=60).opts)
    assert m.eta - m.created == pytest.approx(60)


def test_options_debounce_is_checked_and_needs_a_debounced_task() -> None:
    a = app()
    plain = a.task(name="t.plain")(lambda x: x)
    deb = a.task(name="t.deb", debounce=1)(lambda x: x)
    with pytest.raises(ConfigurationError, match=r"register the task with @app\.task"):
        plain.options(debounce=5)
    with pytest.raises(ConfigurationError, match="debounce must be a finite number"):
        deb.options(debounce=-1)


def test_debounced_tasks_are_refused_where_a_call_could_not_be_superseded_safely() -> None:
    a = app()
    deb = a.task(name="t.deb", debounce=1)(lambda x: x)
    with pytest.raises(ConfigurationError, match="cannot be sent in your transaction"):
        deb.options(connection=object())
    with pytest.raises(ConfigurationError, match="cannot be part of a workflow"):
        chain(deb.s(1), deb.s())
    with pytest.raises(ConfigurationError, match="is debounced"):
        a.periodic(deb, every=60, args=(1,))


def test_a_sealed_task_keys_its_calls_without_telling_the_arguments() -> None:
    from hurtle import new_key

    a = Hurtle("memory://", encryption_keys=[new_key()])

    @a.task(name="t.secret", encrypt=True, debounce=1, debounce_key="email")
    def secret(email: str) -> None: ...

    key = secret.message(("ann@example.com",), {}).headers[DEBOUNCE]
    assert key.startswith("t.secret:") and "ann" not in key
    assert key == secret.message(("ann@example.com",), {}).headers[DEBOUNCE]


def test_latest_names_are_per_queue() -> None:
    assert latest_name("a", "t:k") != latest_name("b", "t:k")


@pytest.mark.parametrize("pool", ["solo", "threads", "asyncio"])
def test_every_pool_runs_only_the_last_call_of_a_key(pool: str) -> None:
    # the solo pool reads the keys in columns (``superseded``), the others may meet a job on
    # its own (``before_batch``): the same outcome
    a = Hurtle("memory://")
    ran: list[int] = []

    @a.task(name="t.touch", debounce=0.2, debounce_key="key", store_result=True)
    def touch(key: str, n: int) -> int:
        ran.append(n)
        return n

    handles = [touch.send("k", n) for n in range(4)]
    a.worker(pool=pool, burst=True).run()
    assert ran == [3]
    assert [h.state() for h in handles] == ["superseded"] * 3 + ["succeeded"]


def test_calls_of_several_queues_in_one_batch_are_kept_apart() -> None:
    a = Hurtle("memory://")
    ran: list[tuple[str, int]] = []

    @a.task(name="t.left", queue="left", debounce=0.2)
    def left(n: int) -> None:
        ran.append(("left", n))

    @a.task(name="t.right", queue="right", debounce=0.2)
    def right(n: int) -> None:
        ran.append(("right", n))

    left.send_many([(1,), (2,)])
    right.send_many([(3,), (4,)])
    a.worker(burst=True, queues=["left", "right"]).run()
    assert sorted(ran) == [("left", 2), ("right", 4)]


def test_only_a_record_of_a_call_made_no_earlier_supersedes() -> None:
    from hurtle.debounce import latest_value, superseded_by

    assert superseded_by(None, "a", 10.0) is None  # no record: it runs
    assert superseded_by(latest_value("a", 10.0), "a", 10.0) is None  # its own
    assert superseded_by(latest_value("b", 11.0), "a", 10.0) == "b"  # a later call
    assert superseded_by(latest_value("b", 10.0), "a", 10.0) == "b"  # later in its batch
    # the record of an earlier call: this call's own record had not landed when it was
    # fetched; it runs rather than be dropped for an older call
    assert superseded_by(latest_value("b", 9.0), "a", 10.0) is None


def test_a_call_fetched_before_its_record_lands_still_runs() -> None:
    # eager mode runs each call inside its publish, before its send records it: every call
    # finds the record of the one before, older than itself, and runs
    from hurtle.testing import eager

    a = Hurtle("memory://")
    ran: list[int] = []

    @a.task(name="t.eager", debounce=0.05, debounce_key="key")
    def touch(key: str, n: int) -> None:
        ran.append(n)

    with eager(a):
        for n in range(3):
            touch.send("k", n)
    assert ran == [0, 1, 2]


def test_other_records_leave_out_only_the_calls_own() -> None:
    from hurtle.debounce import latest_value, other_records

    own = [latest_value("a", 1.0), latest_value("b", 2.0)]
    assert other_records(own, ["a", "b"]) == {}
    assert other_records([*own, None], ["a", "b", "c"]) == {}  # no record: nothing to judge
    assert other_records(own, ["a", "c"]) == {1: own[1]}
    assert other_records(["a"], ["a"]) == {0: "a"}  # the id alone: superseded_by judges it
    assert other_records([latest_value("ab", 1.0)], ["a"]) == {0: latest_value("ab", 1.0)}
    # an id with a line break (not hurtle's) cannot be told apart in C: the loop decides
    assert other_records([latest_value("a\nb", 1.0)], ["a\nb"]) == {}
    assert other_records([latest_value("a\nb", 1.0), "x@1.0"], ["a\nb", "c"]) == {1: "x@1.0"}
