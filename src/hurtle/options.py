"""Per-call options of a send (``SendOptions``: queue, delay, eta, priority, headers, expires)
and the checks of a task's options: each checked once, when given, never per message.

``Task.options`` takes the per-call options, the fields of ``SendOptions``; ``same_options``
gives another ``options`` method (a signature's) those fields as parameters for type checkers,
so that it need not list them again.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, Literal, NoReturn, ParamSpec, TypedDict, TypeVar

import msgspec

from .debounce import check_debounce
from .errors import ConfigurationError
from .limits import KeyFunction
from .message import priority_problem
from .names import QUEUE_NAME_RULE, check_task_name, queue_name_problem
from .seconds import seconds_problem

T = TypeVar("T")
S = TypeVar("S")
OP = ParamSpec("OP")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SendOptions:
    """Per-call options; ``None`` means the task's own setting."""

    queue: str | None = None
    delay: float | None = None
    eta: float | None = None
    priority: int | None = None
    headers: Mapping[str, Any] | None = None
    #: Seconds from the send after which the message is no longer started.
    expires: float | None = None
    #: The window of a debounced task's call (``hurtle.debounce``), instead of the task's.
    debounce: float | None = None

    def __post_init__(self) -> None:  # checked once per options, never per message
        problem = None
        if self.queue is not None:
            problem = queue_name_problem(self.queue)
            if problem is not None:
                problem = f"{problem}; {QUEUE_NAME_RULE}"
        if problem is None and self.priority is not None:
            problem = priority_problem(self.priority)
        if problem is None and self.headers is not None:
            problem = headers_problem(self.headers)
        if problem is None and self.delay is not None:
            problem = seconds_problem(self.delay, "delay")
        if problem is None and self.eta is not None:
            problem = seconds_problem(self.eta, "eta", "a Unix time in seconds (time.time() + s)")
        if problem is None and self.expires is not None:
            problem = seconds_problem(self.expires, "expires")
        if problem is None and self.debounce is not None:
            try:
                check_debounce("", self.debounce)
            except ConfigurationError:
                problem = (
                    f"debounce must be a finite number of seconds > 0, got {self.debounce!r:.60}"
                )
        if problem is not None:
            raise ConfigurationError(problem)

    def resolve(
        self, now: float, queue: str, priority: int, expires: float | None
    ) -> tuple[str, int, float, dict[str, Any], float]:
        """Queue, priority, eta, headers and expiry time of a call sent at ``now`` with these
        options over a task's ``queue``, ``priority`` and ``expires`` (seconds, or None).

        The expiry counts from the send (not from the eta): a message due in an hour that
        expires in ten minutes never runs."""
        eta = 0.0
        if self.eta is not None:
            eta = self.eta
        elif self.delay is not None:
            eta = now + self.delay
        if self.expires is not None:
            expires = self.expires
        return (
            queue if self.queue is None else self.queue,
            priority if self.priority is None else self.priority,
            eta,
            dict(self.headers) if self.headers else {},
            0 if expires is None else now + expires,
        )


def same_options(
    source: Callable[Concatenate[Any, OP], object],
) -> Callable[[Callable[Concatenate[S, ...], T]], Callable[Concatenate[S, OP], T]]:
    """Give a method the keyword parameters of ``source`` (``SendOptions.__init__``) for type
    checkers, so that every ``options`` method takes the same options, listed once."""

    def same(method: Callable[Concatenate[S, ...], T]) -> Callable[Concatenate[S, OP], T]:
        return method

    return same


def headers_problem(headers: object) -> str | None:
    """What is wrong with ``headers=`` (a dict of str keys to values msgspec can encode), or
    None."""
    if not isinstance(headers, Mapping):
        return f"headers must be a dict of str keys, got {type(headers).__name__}: {headers!r:.60}"
    for key in headers:
        if not isinstance(key, str):
            return f"headers must have str keys, got the key {key!r:.60} ({type(key).__name__})"
    try:
        msgspec.msgpack.encode(dict(headers))
    except (TypeError, ValueError, OverflowError, RecursionError) as err:
        return f"headers cannot be encoded ({err}): give plain values (str, int, float, ...)"
    return None


def checked(task: str, check: Callable[[Any], T], value: object) -> T:
    """``check(value)``, its ``ConfigurationError`` naming ``task``."""
    try:
        return check(value)
    except ConfigurationError as err:
        raise ConfigurationError(f"task {task!r}: {err}") from None


def check_priority(task: str, priority: object) -> int:
    problem = priority_problem(priority)
    if problem is not None:
        raise ConfigurationError(f"task {task!r}: {problem}")
    return priority  # type: ignore[return-value]


def check_seconds(task: str, value: object, what: str, unit: str = "a number of seconds") -> None:
    problem = seconds_problem(value, what, unit)
    if problem is not None:
        raise ConfigurationError(f"task {task!r}: {problem}")


# -- Celery's spellings -----------------------------------------------------------------------


class CelerySendOptions(TypedDict, total=False):
    """Celery's per-call options that hurtle takes (``apply_async``, ``signature``, ``set``,
    ``send_task``): ``countdown`` is ``delay``; ``eta`` and ``expires`` may be ``datetime``s."""

    countdown: float | None
    eta: datetime | float | None
    expires: datetime | float | None
    queue: str | None
    priority: int | None
    headers: Mapping[str, Any] | None
    #: The application's connection to write the message in its transaction with (PostgreSQL
    #: broker only: ``Task.options``); a send option, never a signature's.
    connection: object


#: Why a signature refuses a connection (``Task.options(connection=...)``).
NO_CONNECTION = (
    "a signature does not keep a connection: give it when sending "
    "(add.s(1, 2).send(connection=conn), chain(...).send(connection=conn))"
)
_SEND_NAMES = tuple(CelerySendOptions.__annotations__)
_NO_RETRY = "a send returns once the broker has the message, or raises BrokerError: leave it out"
#: Celery's per-call options that hurtle does not take, and what to write instead.
SEND_INSTEAD = {
    "link": "chain the calls instead: add.s(1, 2) | mul.s(3)",
    "link_error": (
        "a call that fails for good becomes a dead letter (hurtle dead ... list), and a "
        "workflow's handle raises TaskFailed naming the step"
    ),
    "task_id": "hurtle makes each message's id: read it from the handle (h.id)",
    "serializer": "messages are always MessagePack: leave it out",
    "compression": "messages are always MessagePack, uncompressed: leave it out",
    "routing_key": "there are no routing keys: give queue=...",
    "exchange": "there are no exchanges: give queue=...",
    "retry": _NO_RETRY,
    "retry_policy": _NO_RETRY,
    "ignore_result": "it is the task's: @app.task(ignore_result=True) (store_result=False)",
    "time_limit": "it is the task's: @app.task(time_limit=N)",
    "soft_time_limit": "hurtle has one time limit, the task's: @app.task(time_limit=N)",
}


def call_args(what: str, args: object, kwargs: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Celery's ``args`` and ``kwargs`` of ``what`` (a tuple or list, a dict of str keys, or
    None), checked."""
    if args is not None and (isinstance(args, str | bytes) or not isinstance(args, Sequence)):
        raise ConfigurationError(
            f"{what} args must be a tuple or list of positional arguments, got "
            f"{type(args).__name__}"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"{what} kwargs must be a dict, got {type(kwargs).__name__}")
    for key in kwargs or ():
        if not isinstance(key, str):
            raise ConfigurationError(f"{what} kwargs must have str keys, got {key!r:.60}")
    return tuple(args or ()), dict(kwargs or {})


def celery_send(what: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """hurtle's per-call options (``Task.options``'s keywords) for Celery's ``options`` of
    ``what``; one given as None is left out, as Celery does. A naive ``datetime`` is read in the
    local time zone. An option hurtle does not take raises ``ConfigurationError`` saying what
    to write instead; the values are checked where the options are made."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in _SEND_NAMES:
            instead = SEND_INSTEAD.get(key, f"the options it takes are {', '.join(_SEND_NAMES)}")
            raise ConfigurationError(f"{what} does not take {key}=...: {instead}")
        if value is None:
            continue
        if key == "countdown":
            out["delay"] = value
        elif key == "eta" and isinstance(value, datetime):
            out["eta"] = value.timestamp()
        elif key == "expires" and isinstance(value, datetime):
            out["expires"] = max(value.timestamp() - time.time(), 0.0)
        else:
            out[key] = value
    return out


class CeleryTaskOptions(TypedDict, total=False):
    """Celery's task options that ``@app.task`` takes beside its own (``celery_task``)."""

    max_retries: int
    autoretry_for: type[BaseException] | tuple[type[BaseException], ...]
    retry_backoff: bool | float
    ignore_result: bool
    acks_late: Literal[True]
    bind: Literal[False]


class TaskOptions(TypedDict, total=False):
    """The options of ``@app.task`` (``Hurtle.task``) beside its name, as given and once Celery's
    are read; one left out is one given as None (``priority``: 0). ``Task`` checks them, and
    fills in the app's settings for those given as None (queue, retries, retry_delay,
    store_result, result_ttl, encrypt); ``Limits`` checks the limit options."""

    queue: str | None
    retries: int | None
    retry_delay: float | None
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None
    priority: int
    time_limit: float | None
    store_result: bool | None
    result_ttl: float | None
    rate_limit: str | None
    rate_limit_key: KeyFunction | None
    on_429: bool | Callable[[Exception], bool | float | None] | None
    concurrency_limit: int | None
    concurrency_key: KeyFunction | None
    unique_for: float | None
    unique_key: KeyFunction | None
    expires: float | None
    encrypt: bool | None
    debounce: float | None
    debounce_key: KeyFunction | str | None
    fair_key: KeyFunction | str | None
    fair_weights: Mapping[str, int] | None


class TaskKeywords(TaskOptions, CeleryTaskOptions, total=False):
    """The keyword options of ``@app.task``: its name, hurtle's options and Celery's."""

    name: str | None


#: The options of ``@app.task``, for messages that list them.
TASK_OPTIONS = ["name", *TaskOptions.__annotations__]
#: Celery's task options that hurtle does not take, and what to write instead.
TASK_INSTEAD = {
    "soft_time_limit": (
        "hurtle has one time limit: give time_limit=N seconds (the task is interrupted with "
        "hurtle.TimeLimitExceeded, then retried or dead-lettered)"
    ),
    "default_retry_delay": "give retry_delay=N, the first delay of hurtle's exponential backoff",
    "retry_backoff_max": "the longest delay is the app's: Hurtle(max_retry_delay=N)",
    "retry_jitter": "hurtle's backoff always has jitter (±25%): leave it out",
    "track_started": "hurtle records no started state (a task being run reads PENDING)",
    "serializer": "messages are always MessagePack: leave it out",
    "typing": "hurtle always checks the arguments against the signature at send: leave it out",
    "reject_on_worker_lost": (
        "a message whose worker keeps dying becomes a dead letter after "
        "HURTLE_MAX_RECOVERIES deaths: leave it out"
    ),
    "base": "hurtle has no task classes: put what the base class did in a Middleware",
    "shared": "a task belongs to the app that registers it: leave it out",
}


def task_options(fn: Callable[..., Any], given: TaskKeywords) -> tuple[str, TaskOptions]:
    """The name and options of ``fn`` registered with ``@app.task(**given)``: the name is
    ``given["name"]``, else ``fn``'s module and qualified name; Celery's options are read by
    ``celery_task`` (which refuses any option neither hurtle nor Celery has)."""
    name = given.get("name")
    task = _default_name(fn) if name is None else check_task_name(name)
    hurtle: TaskOptions = {}
    celery: dict[str, Any] = {}
    for key, value in given.items():
        if key in _TASK_FIELDS:
            hurtle[key] = value  # type: ignore[literal-required]
        elif key != "name":
            celery[key] = value
    return task, celery_task(task, celery, hurtle) if celery else hurtle


_TASK_FIELDS = frozenset(TaskOptions.__annotations__)


def _default_name(fn: Callable[..., Any]) -> str:
    module = fn.__module__
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            module = spec.name
        elif getattr(main, "__file__", None):
            module = Path(main.__file__).stem  # type: ignore[union-attr,arg-type]
    return f"{module}.{fn.__qualname__}"


def celery_task(task: str, given: Mapping[str, Any], hurtle: TaskOptions) -> TaskOptions:
    """hurtle's options of ``task`` once Celery's ``given`` ones (``CeleryTaskOptions``) are
    read: ``max_retries`` is ``retries``, ``autoretry_for`` is ``retry_on``, ``retry_backoff``
    the first delay (True: 1 s, as in Celery), ``ignore_result`` the opposite of
    ``store_result``; ``acks_late=True`` and ``bind=False`` are what hurtle does anyway. Any
    other option, or a value hurtle has no meaning for, raises ``ConfigurationError`` naming
    what to write instead; so does an option given under both names."""
    retries, retry_delay, store_result, retry_on = (
        hurtle.get("retries"),
        hurtle.get("retry_delay"),
        hurtle.get("store_result"),
        hurtle.get("retry_on"),
    )
    for key, value in given.items():
        if key == "max_retries":
            _once(task, key, retries, "retries")
            if type(value) is not int or value < 0:
                _refuse(task, key, value, "give max_retries=N, an int >= 0 (no retrying for ever)")
            retries = value
        elif key == "autoretry_for":
            _once(task, key, retry_on, "retry_on")
            retry_on = exception_classes(task, "autoretry_for", value)
        elif key == "retry_backoff":
            _once(task, key, retry_delay, "retry_delay")
            if value is False:
                _refuse(task, key, value, "hurtle's retries always back off: leave it out")
            retry_delay = 1.0 if value is True else value
            if seconds_problem(retry_delay, key) is not None or not retry_delay:
                _refuse(task, key, value, "give True, or the first delay in seconds (> 0)")
        elif key == "ignore_result":
            if not isinstance(value, bool):
                _refuse(task, key, value, "give True or False")
            if store_result is value:
                _refuse(task, key, value, f"it contradicts store_result={store_result}")
            store_result = not value
        elif key == "acks_late":
            if value is not True:
                _refuse(
                    task,
                    key,
                    value,
                    "hurtle always acknowledges late, once the outcome is "
                    "recorded: leave acks_late out",
                )
        elif key == "bind":
            if value is not False:
                _refuse(
                    task,
                    key,
                    value,
                    "hurtle has no bound tasks: drop bind=True and the "
                    "task's self parameter (self.retry(countdown=N) is raise Retry(delay=N))",
                )
        else:
            instead = TASK_INSTEAD.get(key, f"its options are {', '.join(TASK_OPTIONS)}")
            raise ConfigurationError(f"task {task!r}: @app.task does not take {key}=: {instead}")
    return {
        **hurtle,
        "retries": retries,
        "retry_delay": retry_delay,
        "store_result": store_result,
        "retry_on": retry_on,
    }


def _refuse(task: str, key: str, value: object, why: str) -> NoReturn:
    raise ConfigurationError(f"task {task!r}: {key}={value!r:.60} is not taken: {why}")


def _once(task: str, key: str, mine: object, name: str) -> None:
    if mine is not None:
        raise ConfigurationError(
            f"task {task!r}: {key}= is hurtle's {name}=, also given: give one of them"
        )


def exception_classes(task: str, what: str, value: object) -> tuple[type[BaseException], ...]:
    """``value`` as a tuple of exception classes (one class, or a tuple or list of them)."""
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(
                f"task {task!r}: {what} must be exception classes, such as (ConnectionError,), "
                f"got {item!r:.60}"
            )
    return tuple(items)
