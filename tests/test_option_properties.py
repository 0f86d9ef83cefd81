"""Property-based tests (hypothesis) of option checking: for ``@app.task(...)``,
``.options(...)`` (of a task and of a signature), ``send``, ``app.periodic`` and ``app.channel``,
any value is either taken (when the documented rule allows it) or refused at the call with the
documented error — ``ConfigurationError``, ``ArgumentError`` for arguments that do not fit,
``EncodeError`` for arguments that cannot be encoded — and then nothing reaches the broker.
Each rule is restated here as a predicate, independently of the code that enforces it.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Callable
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurtle import ArgumentError, ConfigurationError, EncodeError, Hurtle

#: Modest by default, to keep the suite fast; HURTLE_PROPERTY_EXAMPLES=1000 searches harder.
EXAMPLES = settings(
    max_examples=int(os.environ.get("HURTLE_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)

numbers = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(10**3), max_value=10**3)
    | st.just(10**400)
    | st.booleans()
)
#: Anything a caller might pass by mistake, and some values that are right.
anything = (
    st.none()
    | numbers
    | st.text(max_size=8)
    | st.binary(max_size=4)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3) | st.integers(), st.integers(), max_size=2)
    | st.builds(object)
)
queue_names = (
    st.from_regex(r"[A-Za-z0-9._:-]{1,100}", fullmatch=True)
    | st.text(max_size=120)
    | st.just("x" * 101)
)


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _finite_at_least(value: Any, low: float, strict: bool = False) -> bool:
    if not _number(value):
        return False
    try:
        finite = math.isfinite(value)
    except OverflowError:
        return False
    return finite and (value > low if strict else value >= low)


def _queue_ok(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9._:-]{1,100}", value) is not None


def _headers_ok(value: Any) -> bool:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return False
    try:
        msgspec.msgpack.encode(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _priority_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 9


def _waiting(app: Hurtle) -> int:
    return sum(s.ready + s.delayed for s in app.broker.stats().values())


def _check(call: Callable[[], object], valid: bool, app: Hurtle, *errors: type) -> None:
    """``call`` succeeds when ``valid``; else it raises one of ``errors`` and sends nothing."""
    before = _waiting(app)
    if valid:
        call()
        return
    try:
        call()
    except errors:
        assert _waiting(app) == before
    else:
        raise AssertionError("an invalid value was taken")


PER_CALL: dict[str, Callable[[Any], bool]] = {
    "queue": _queue_ok,
    "delay": lambda v: _finite_at_least(v, 0),
    "eta": lambda v: _finite_at_least(v, 0),
    "expires": lambda v: _finite_at_least(v, 0),
    "priority": _priority_ok,
    "headers": _headers_ok,
}


@EXAMPLES
@given(
    option=st.sampled_from(sorted(PER_CALL)),
    value=anything | queue_names,
    through=st.sampled_from(["task", "signature", "apply_async"]),
)
def test_a_per_call_option_is_taken_when_the_rule_allows_it_else_refused(
    option: str, value: Any, through: str
) -> None:
    app = Hurtle("memory://")

    @app.task(name="t")
    def t() -> None: ...

    valid = value is None or PER_CALL[option](value)

    def call() -> object:
        if through == "task":
            return t.options(**{option: value}).send()
        if through == "signature":
            return t.s().options(**{option: value}).send()
        celery = {"delay": "countdown"}.get(option, option)
        if option == "eta" and value is not None and not valid:
            return t.apply_async(eta=value)
        return t.apply_async(**{celery: value})

    _check(call, valid, app, ConfigurationError)


TASK_OPTIONS: dict[str, Callable[[Any], bool]] = {
    "queue": lambda v: v is None or _queue_ok(v),
    "name": lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 200),
    "retries": lambda v: v is None or (type(v) is int and v >= 0),
    "retry_delay": lambda v: v is None or _finite_at_least(v, 0),
    "priority": _priority_ok,
    "time_limit": lambda v: v is None or _finite_at_least(v, 0, strict=True),
    "result_ttl": lambda v: v is None or _finite_at_least(v, 0, strict=True),
    "expires": lambda v: v is None or _finite_at_least(v, 0),
    "store_result": lambda v: v is None or isinstance(v, bool),
    "unique_for": lambda v: v is None or _finite_at_least(v, 0, strict=True),
    "concurrency_limit": lambda v: v is None or (type(v) is int and v >= 1),
}


@EXAMPLES
@given(
    option=st.sampled_from(sorted(TASK_OPTIONS)),
    value=anything | queue_names | st.text(min_size=199, max_size=202),
)
def test_a_task_option_is_taken_when_the_rule_allows_it_else_refused(
    option: str, value: Any
) -> None:
    app = Hurtle("memory://")

    def register() -> object:
        task = app.task(**{option: value})(lambda: None)
        return task.send() if option != "unique_for" else None

    _check(register, TASK_OPTIONS[option](value), app, ConfigurationError)
    assert app.tasks == {} or TASK_OPTIONS[option](value)


plain = st.none() | st.integers() | st.text(max_size=4) | st.floats(allow_nan=False)


@EXAMPLES
@given(
    args=st.lists(plain | st.builds(object), max_size=3),
    kwargs=st.dictionaries(st.sampled_from(["x", "y", "z"]), plain, max_size=2),
    many=st.booleans(),
)
def test_send_takes_arguments_that_fit_and_encode_else_refuses_them(
    args: list[Any], kwargs: dict[str, Any], many: bool
) -> None:
    app = Hurtle("memory://")

    @app.task(name="f")
    def f(x: Any, y: Any = 0) -> None: ...

    try:
        inspect.signature(f.fn).bind(*args, **kwargs)
        fits = True
    except TypeError:
        fits = False
    try:
        msgspec.msgpack.encode([args, kwargs])
        encodes = True
    except (TypeError, OverflowError):
        encodes = False

    def send() -> object:
        if many:
            return f.send_many([tuple(args) if not kwargs else f.args(*args, **kwargs)])
        return f.send(*args, **kwargs)

    _check(send, fits and encodes, app, ArgumentError if not fits else EncodeError)


@EXAMPLES
@given(
    every=anything,
    name=st.none() | st.text(max_size=3) | st.integers(),
    catch_up=anything,
    args=st.sampled_from([(), [1], (1,), "a", None, 5]),
)
def test_a_periodic_schedule_is_taken_when_the_rule_allows_it_else_refused(
    every: Any, name: Any, catch_up: Any, args: Any
) -> None:
    app = Hurtle("memory://")

    @app.task(name="job")
    def job(x: int = 0) -> None: ...

    valid = (
        _number(every)
        and _finite_at_least(every, 0.001)
        and every <= 1e9
        and (name is None or (isinstance(name, str) and name != ""))
        and isinstance(catch_up, bool)
        and isinstance(args, tuple | list)
    )
    kwargs = {"every": every, "name": name, "catch_up": catch_up}
    if args is not None:
        kwargs["args"] = args
    _check(lambda: app.periodic(job, **kwargs), valid, app, ConfigurationError)
    assert bool(app.schedules) == valid


@EXAMPLES
@given(
    name=anything | st.sampled_from(["prices", "prices.*", "a?", "[x]", "ok.name"]),
    buffer=anything,
    flush_interval=anything,
)
def test_a_channel_is_made_when_the_rule_allows_it_else_refused(
    name: Any, buffer: Any, flush_interval: Any
) -> None:
    app = Hurtle("memory://")
    valid = (
        isinstance(name, str)
        and name != ""
        and not any(c in name for c in "*?[")
        and (buffer is None or (type(buffer) is int and buffer >= 0))
        and (flush_interval is None or _finite_at_least(flush_interval, 0, strict=True))
    )
    _check(
        lambda: app.channel(name, buffer=buffer, flush_interval=flush_interval),
        valid,
        app,
        ConfigurationError,
    )


@EXAMPLES
@given(timeout=anything)
def test_a_result_timeout_that_is_no_duration_is_refused_at_once(timeout: Any) -> None:
    app = Hurtle("memory://", store_results=True)

    @app.task(name="t")
    def t() -> None: ...

    handle = t.send()
    valid = timeout is None or (_number(timeout) and timeout >= 0)  # False for NaN
    if valid:
        return  # waiting for it is the other tests' business
    try:
        handle.result(timeout)
    except ConfigurationError:
        pass
    else:
        raise AssertionError(f"timeout={timeout!r} was taken")
