"""Bad input at the edges: options, arguments, deep nesting, decoding, the codec's type mapping.

Everything here runs on the memory broker (the conformance suite pins the same checks on every
broker); what a worker does with bad bytes runs a real burst worker in this process.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import inspect
import itertools
import math
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from helpers import ROOT, hurtle_env
from hurtle import (
    Args,
    ArgumentError,
    ConfigurationError,
    DecodeError,
    EncodeError,
    Hurtle,
    Message,
    Retry,
)
from hurtle.arity import Arity
from hurtle.message import check_messages, decode_unchecked


@pytest.fixture
def app() -> Hurtle:
    return Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)


def _nothing_stored(app: Hurtle, queue: str = "default") -> bool:
    s = app.broker.stats([queue])[queue]
    return (s.ready, s.delayed, s.in_flight, s.dead) == (0, 0, 0, 0)


def _nested(depth: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return top


# -- options and registration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"priority": 5.5}, "priority must be an int from 0 to 9, got 5.5"),
        ({"priority": True}, "priority must be an int from 0 to 9, got True"),
        ({"priority": "5"}, "priority must be an int from 0 to 9, got '5'"),
        ({"priority": 10}, "priority 10 is out of range"),
        ({"priority": -1}, "priority -1 is out of range"),
        ({"delay": float("nan")}, "delay must be a finite number, got nan"),
        ({"delay": float("inf")}, "delay must be a finite number, got inf"),
        ({"delay": 10**400}, "delay must be a finite number, got 1000"),
        ({"delay": -5}, "delay must be >= 0, got -5"),
        ({"delay": "5"}, "delay must be a number of seconds, got '5'"),
        ({"eta": "tomorrow"}, "eta must be a Unix time in seconds"),
        ({"eta": float("nan")}, "eta must be a finite number, got nan"),
        ({"queue": ""}, "a queue name must not be empty"),
    ],
)
def test_options_refuse_a_bad_value_naming_the_task_the_option_and_the_value(
    app: Hurtle, options: dict[str, Any], named: str
) -> None:
    @app.task(name="jobs.add")
    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(ConfigurationError) as info:
        add.options(**options)
    assert named in str(info.value)
    assert "'jobs.add'" in str(info.value)
    assert _nothing_stored(app)


def test_a_bad_eta_is_named_as_the_eta_not_as_the_priority(app: Hurtle) -> None:
    @app.task(name="jobs.f")
    def f() -> None:
        pass

    with pytest.raises(ConfigurationError, match="eta") as info:
        f.options(eta="tomorrow")  # type: ignore[arg-type]
    assert "priority" not in str(info.value)


def test_a_nan_delay_on_sqlite_is_refused_instead_of_silently_dropped(tmp_path: Path) -> None:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}")

    @app.task
    def f() -> None:
        pass

    with pytest.raises(ConfigurationError, match="nan"):
        f.options(delay=float("nan")).send()
    assert _nothing_stored(app)
    app.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"priority": 2.5}, "priority must be an int from 0 to 9, got 2.5"),
        ({"priority": 10}, "priority 10 is out of range"),
        ({"retries": -1}, "retries must be an int >= 0, got -1"),
        ({"retries": 1.5}, "retries must be an int >= 0, got 1.5"),
        ({"retry_delay": float("nan")}, "retry_delay must be a finite number, got nan"),
        ({"retry_delay": -1}, "retry_delay must be >= 0"),
        ({"time_limit": float("inf")}, "time_limit must be a finite number, got inf"),
        ({"time_limit": 0}, "time_limit must be > 0"),
    ],
)
def test_registration_refuses_a_bad_task_option(
    app: Hurtle, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        app.task(name="jobs.f", **options)(lambda: None)
    assert named in str(info.value) and "'jobs.f'" in str(info.value)
    assert "jobs.f" not in app.tasks


def test_retry_with_a_bad_delay_fails_where_it_is_raised(app: Hurtle) -> None:
    for delay in (float("nan"), float("inf"), -1.0, "5", 10**400):
        with pytest.raises(ConfigurationError, match=r"Retry\(delay=\.\.\.\)"):
            Retry(delay=delay)  # type: ignore[arg-type]
    assert Retry(delay=0).delay == 0
    assert Retry().delay is None


def test_a_task_raising_retry_with_a_nan_delay_fails_by_its_policy_and_loses_nothing(
    app: Hurtle,
) -> None:
    runs: list[int] = []

    @app.task(retries=1, retry_delay=0.01)
    def again() -> None:
        runs.append(1)
        raise Retry(delay=float("nan"))

    again.send()
    app.worker(burst=True).run()
    assert len(runs) == 2  # the first attempt, then its one retry
    (dead,) = app.broker.dead_letters("default")
    assert "Retry(delay=...) must be a finite number, got nan" in dead.reason


# -- arguments that do not fit the signature -------------------------------------------------


def test_send_with_too_many_arguments_raises_argument_error_naming_task_and_signature(
    app: Hurtle,
) -> None:
    @app.task(name="jobs.add")
    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(ArgumentError) as info:
        add.send(1, 2, 3)  # type: ignore[call-arg]
    text = str(info.value)
    assert "jobs.add(x, y)" in text
    assert "too many positional arguments" in text and "nothing was enqueued" in text
    assert isinstance(info.value, TypeError)
    with pytest.raises(ArgumentError, match="missing a required argument: 'y'"):
        add.send(1)  # type: ignore[call-arg]
    with pytest.raises(ArgumentError, match="unexpected keyword argument 'z'"):
        add.options(queue="other").send(1, y=2, z=3)  # type: ignore[call-arg]
    with pytest.raises(ArgumentError, match="multiple values for argument 'x'"):
        add.send(1, x=2)  # type: ignore[misc]
    assert _nothing_stored(app) and _nothing_stored(app, "other")


def test_send_many_with_one_call_that_does_not_fit_enqueues_nothing(app: Hurtle) -> None:
    @app.task
    def add(x: int, y: int = 0) -> int:
        return x + y

    for bad in ([(1, 2), (1,), (1, 2, 3)], [{"x": 1}, {"y": 2}], [(1,), Args(1, z=2)], [()]):
        with pytest.raises(ArgumentError):
            add.send_many(bad)
        assert _nothing_stored(app)
    ids = add.send_many([(1,), (1, 2), [1, 2], {"x": 1, "y": 2}, {"x": 1}, Args(1, y=2)])
    assert len(ids) == 6


def test_functions_taking_star_args_and_keywords_accept_any_call(app: Hurtle) -> None:
    @app.task
    def anything(*args: Any, **kwargs: Any) -> None:
        pass

    anything.send()
    anything.send(1, 2, 3, k=4)
    anything.send_many([(), (1,) * 50, {"a": 1}, Args(1, b=2)])
    assert app.broker.stats(["default"])["default"].ready == 6


def _signatures() -> list[inspect.Signature]:
    def f1(a, b, /, c, d=1, *, e, f=2): ...  # type: ignore[no-untyped-def]
    def f2(a, *args, b=1, **kwargs): ...  # type: ignore[no-untyped-def]
    def f3(a=1, /, b=2): ...  # type: ignore[no-untyped-def]
    def f4(*, k): ...  # type: ignore[no-untyped-def]
    def f5(a, /, **kwargs): ...  # type: ignore[no-untyped-def]
    def f6(): ...  # type: ignore[no-untyped-def]

    return [inspect.signature(f) for f in (f1, f2, f3, f4, f5, f6)]


def test_the_cheap_arity_check_agrees_with_python_binding_on_every_call_shape() -> None:
    names = ["a", "b", "c", "d", "e", "f", "k", "zz"]
    keyword_sets = [kw for r in range(4) for kw in itertools.combinations(names, r)]
    for sig in _signatures():
        arity = Arity(sig)
        for n in range(6):
            for kw in keyword_sets:
                args, kwargs = tuple(range(n)), dict.fromkeys(kw, 0)
                try:
                    sig.bind(*args, **kwargs)
                    expected = True
                except TypeError:
                    expected = False
                assert arity.fits(args, kwargs) is expected, (sig, n, kw)
                assert arity.fits(args, kwargs) is expected  # and again, from the shape cache


# -- typing ----------------------------------------------------------------------------------


def test_mypy_checks_sends_and_send_many_items_built_with_args_against_the_function(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mypy")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
        from hurtle import Hurtle

        app = Hurtle("memory://")

        @app.task
        def add(x: int, y: int) -> int:
            return x + y

        add.send(1, 2)
        add.send_many([add.args(1, 2), add.args(x=1, y=2)])
        add.send_many(add.args(i, i) for i in range(3))
        add.options(priority=1).send_many([add.args(1, 2)])
        add.send(1, "x")  # line 14
        add.send_many([add.args(1, "x")])  # line 15
        add.options(priority=1).send_many([add.args("x", 2)])  # line 16
        """
        )
    )
    # in a subprocess: mypy raises the interpreter's recursion limit for good
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--python-version",
            "3.11",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        env=hurtle_env(),
        timeout=300,
        check=False,
    )
    flagged = sorted(
        {int(line.split(":")[1]) for line in result.stdout.splitlines() if ": error:" in line}
    )
    assert flagged == [14, 15, 16], result.stdout + result.stderr
    assert result.returncode == 1


# -- deep nesting and decoding ---------------------------------------------------------------


def test_arguments_nested_too_deeply_raise_encode_error_not_recursion_error(
    app: Hurtle,
) -> None:
    @app.task(name="jobs.deep")
    def deep(x: Any) -> None:
        pass

    with pytest.raises(EncodeError, match=r"jobs\.deep.*nested too deeply"):
        deep.send(_nested(5000))
    with pytest.raises(EncodeError, match="nested too deeply"):
        deep.send_many([(1,), (_nested(5000),)])
    assert _nothing_stored(app)


def _raw(**fields: Any) -> bytes:
    values = {
        "id": "m1",
        "task": "jobs.f",
        "queue": "default",
        "args": [],
        "kwargs": {},
        "attempt": 0,
        "priority": 0,
        "eta": 0.0,
        "created": 0.0,
        "headers": {},
    }
    values.update(fields)
    return msgspec.msgpack.encode(list(values.values()))


def _raw_nested(depth: int) -> bytes:
    """A message whose one argument is a list nested ``depth`` deep (too deep to encode here)."""
    marker = "@@nested@@"
    deep = b"\x91" * depth + b"\x90"  # msgpack: arrays of one item, then an empty one
    return _raw(args=[marker]).replace(msgspec.msgpack.encode(marker), deep)


def test_decoding_bytes_nested_too_deeply_raises_decode_error() -> None:
    raw = _raw_nested(1000)
    with pytest.raises(DecodeError, match="nested too deeply"):
        Message.decode(raw)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"priority": 42}, "priority 42 is out of range"),
        ({"priority": -1}, "priority -1 is out of range"),
        ({"priority": 5.5}, "priority must be an int from 0 to 9, got 5.5"),
        ({"priority": True}, "got True"),
        ({"attempt": -1}, "attempt -1"),
        ({"eta": float("nan")}, "eta must be a finite number, got nan"),
        ({"eta": float("inf")}, "eta must be a finite number, got inf"),
        ({"eta": "soon"}, "eta must be a Unix time"),
        ({"created": float("-inf")}, "created must be a finite number"),
    ],
)
def test_decode_refuses_a_message_whose_trusted_fields_are_invalid(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(DecodeError) as info:
        Message.decode(_raw(**fields))
    assert str(info.value).startswith("not a valid hurtle message")
    assert named in str(info.value)


def test_a_worker_dead_letters_invalid_and_too_deep_bytes_and_runs_the_rest(app: Hurtle) -> None:
    seen: list[int] = []

    @app.task(name="jobs.f")
    def f(i: int) -> None:
        seen.append(i)

    app.broker.publish_raw(
        "default",
        [
            _raw(priority=42),
            _raw_nested(1000),
            _raw(eta=float("nan")),
        ],
    )
    f.send_many([(i,) for i in range(3)])
    app.worker(burst=True).run()
    assert sorted(seen) == [0, 1, 2]
    reasons = sorted(d.reason for d in app.broker.dead_letters("default"))
    assert len(reasons) == 3
    assert all(r.startswith("undecodable message") for r in reasons), reasons
    assert any("priority 42" in r for r in reasons)
    assert any("nested too deeply" in r for r in reasons)
    assert any("eta must be a finite number, got nan" in r for r in reasons)


def test_valid_messages_decode_the_same_with_the_checked_and_the_unchecked_decoder() -> None:
    m = Message(id="x", task="t", queue="q", args=(1,), attempt=3, priority=9, eta=1e9, created=1.5)
    assert Message.decode(m.encode()) == decode_unchecked(m.encode()) == m
    check_messages([m])


# -- the codec's type mapping ----------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")
_UTC = datetime.UTC

#: what a task is sent -> what it receives: the table in docs/tasks.md ("What a task receives")
MAPPING: list[tuple[str, Any, Any]] = [
    ("tuple", (1, 2), [1, 2]),
    ("set", {1}, [1]),
    ("frozenset", frozenset({1}), [1]),
    ("bytearray", bytearray(b"ab"), b"ab"),
    ("uuid.UUID", _UUID, str(_UUID)),
    ("naive datetime", datetime.datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05"),
    (
        "aware datetime",
        datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=_UTC),
        datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=_UTC),
    ),
    ("date", datetime.date(2026, 1, 2), "2026-01-02"),
    ("Decimal", decimal.Decimal("1.5"), "1.5"),
    ("Enum", Colour.RED, "red"),
    ("dataclass", Point(1, 2), {"x": 1, "y": 2}),
]


@pytest.mark.parametrize(("name", "sent", "received"), MAPPING, ids=[m[0] for m in MAPPING])
def test_the_codec_maps_types_as_the_readme_says(
    app: Hurtle, name: str, sent: Any, received: Any
) -> None:
    got: list[Any] = []

    @app.task
    def keep(x: Any) -> None:
        got.append(x)

    keep.send(sent)
    app.worker(burst=True).run()
    assert got == [received] and type(got[0]) is type(received)
    readme = (ROOT / "docs" / "tasks.md").read_text()
    assert f"| {name} |" in readme, f"the type table of docs/tasks.md has no row for {name}"


def test_the_publish_check_accepts_whatever_decode_accepts_at_the_bounds() -> None:
    ok = [
        Message(id="a", task="t", queue="q", priority=p, attempt=a, eta=e, created=c)
        for p, a, e, c in [(0, 0, 0.0, 0.0), (9, 10**6, 1.7e308, 1.7e308), (5, 1, 0, 1)]
    ]
    check_messages(ok)
    assert [Message.decode(m.encode()) for m in ok] == ok
    assert not math.isnan(ok[0].eta)


# -- settings --------------------------------------------------------------------------------


def _numeric_settings() -> list[str]:
    from hurtle.settings import BOUNDS

    return sorted(BOUNDS)


@pytest.mark.parametrize("name", _numeric_settings())
@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "-1"])
def test_every_numeric_setting_refuses_nan_infinity_and_negatives_at_load(
    name: str, raw: str
) -> None:
    from hurtle.settings import load_settings

    variable = f"HURTLE_{name.upper()}"
    with pytest.raises(ConfigurationError, match=rf"^{variable}='{raw}': {name} must be") as info:
        load_settings(environ={variable: raw})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"heartbeat_timeout": float("nan")}, "heartbeat_timeout=nan: heartbeat_timeout must"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout must be > 0"),
        ({"fetch_batch_size": 0}, "fetch_batch_size must be >= 1"),
        ({"fetch_batch_size": 2.5}, "fetch_batch_size must be a whole number"),
        ({"shutdown_timeout": "30"}, "shutdown_timeout must be a number, got '30'"),
        (
            {"default_queue": ""},
            "default_queue is not a queue name: a queue name must not be empty",
        ),
    ],
)
def test_keyword_settings_are_checked_like_the_environment(
    overrides: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        Hurtle("memory://", **overrides)
    assert named in str(info.value)


def test_good_settings_load_from_the_environment() -> None:
    from hurtle.settings import load_settings

    s = load_settings(
        environ={
            "HURTLE_HEARTBEAT_TIMEOUT": "2.5",
            "HURTLE_SHUTDOWN_TIMEOUT": "0",
            "HURTLE_FETCH_BATCH_SIZE": "10",
        }
    )
    assert (s.heartbeat_timeout, s.shutdown_timeout, s.fetch_batch_size) == (2.5, 0.0, 10)


# -- a call that cannot bind, already in the queue -------------------------------------------


def test_a_queued_call_that_cannot_bind_is_dead_lettered_at_once_not_retried(app: Hurtle) -> None:
    runs: list[int] = []

    @app.task(name="jobs.add", retries=3, retry_delay=0.01)
    def add(x: int, y: int) -> int:
        runs.append(x)
        return x + y

    # sent by a producer with another version of the code: send() would refuse it
    app.broker.publish([Message(id="m1", task="jobs.add", queue="default", args=(1, 2, 3))])
    app.broker.publish([Message(id="m2", task="jobs.add", queue="default", args=(1, 2))])
    app.worker(burst=True).run()
    assert runs == [1]  # only the call that fits ran
    (dead,) = app.broker.dead_letters("default")
    assert "too many positional arguments" in dead.reason
    assert "jobs.add(x, y)" in dead.reason and "retrying cannot help" in dead.reason
    m = dead.message()
    assert m is not None and m.attempt == 0  # no retry was spent on it


def test_a_type_error_raised_inside_a_task_is_still_retried(app: Hurtle) -> None:
    runs: list[int] = []

    @app.task(retries=1, retry_delay=0.01)
    def broken(x: int) -> None:
        runs.append(x)
        raise TypeError("a bug in the task")

    broken.send(1)
    app.worker(burst=True).run()
    assert runs == [1, 1]


def test_send_many_checks_a_task_priority_reassigned_after_registration(app: Hurtle) -> None:
    @app.task
    def f(x: int) -> None:
        pass

    f.priority = 42
    with pytest.raises(ConfigurationError, match="priority 42"):
        f.send_many([(1,)])
    with pytest.raises(EncodeError, match="priority 42"):
        f.send(1)
    assert _nothing_stored(app)
