"""``Task``: a registered function that can be sent to a queue, and per-call options.

``add.send(1, 2)`` builds one frozen ``Message`` and publishes it; ``add.send_many(...)`` builds
a batch and publishes it in one round trip; ``add(1, 2)`` is still a plain local call.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from .errors import ConfigurationError
from .ids import new_id
from .message import MAX_PRIORITY, MIN_PRIORITY, Message

if TYPE_CHECKING:
    from .app import Hurtle

P = ParamSpec("P")
R = TypeVar("R")


class Args:
    """Positional and keyword arguments of one call, for ``send_many``: ``Args(1, y=2)``."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


@dataclasses.dataclass(frozen=True, kw_only=True)
class SendOptions:
    """Per-call options; ``None`` means the task's own setting."""

    queue: str | None = None
    delay: float | None = None
    eta: float | None = None
    priority: int | None = None
    headers: Mapping[str, Any] | None = None


def _check_priority(priority: int) -> int:
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigurationError(
            f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {priority!r}"
        )
    return priority


class Task(Generic[P, R]):
    """A function registered with an app under ``name``."""

    def __init__(
        self,
        app: Hurtle,
        fn: Callable[P, R],
        *,
        name: str,
        queue: str,
        retries: int,
        retry_delay: float,
        priority: int = 0,
        time_limit: float | None = None,
    ) -> None:
        if retries < 0:
            raise ConfigurationError(f"task {name!r}: retries must be >= 0, got {retries}")
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retries = retries
        self.retry_delay = retry_delay
        self.priority = _check_priority(priority)
        self.time_limit = time_limit
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def message(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SendOptions | None = None
    ) -> Message:
        """The message one call would send, without sending it."""
        now = time.time()
        queue, priority, eta, headers = self._resolve(options, now)
        return Message(
            id=new_id(), task=self.name, queue=queue, args=args, kwargs=kwargs,
            priority=priority, eta=eta, created=now, headers=headers,
        )

    def _resolve(
        self, options: SendOptions | None, now: float
    ) -> tuple[str, int, float, dict[str, Any]]:
        """Queue, priority, eta and headers of a call with ``options``."""
        if options is None:
            return self.queue, self.priority, 0.0, {}
        eta = 0.0
        if options.eta is not None:
            eta = options.eta
        elif options.delay is not None:
            eta = now + options.delay
        return (
            self.queue if options.queue is None else options.queue,
            self.priority if options.priority is None else _check_priority(options.priority),
            eta,
            dict(options.headers) if options.headers else {},
        )

    def send(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue one call; returns its message id once the broker has it."""
        message = self.message(args, kwargs)
        self.app.broker.publish([message])
        return message.id

    def send_many(self, calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args]
                  ) -> list[str]:
        """Enqueue many calls in one batch; returns their ids in order.

        Each item is a tuple (or list) of positional arguments, a dict of keyword arguments, or an
        ``Args(*args, **kwargs)``. If any argument cannot be encoded, nothing is enqueued.
        """
        return _send_many(self, calls, None)

    def options(
        self,
        *,
        queue: str | None = None,
        delay: float | None = None,
        eta: float | None = None,
        priority: int | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> BoundTask[P, R]:
        """This task with per-call options: ``add.options(delay=30, priority=9).send(1, 2)``."""
        if priority is not None:
            _check_priority(priority)
        opts = SendOptions(queue=queue, delay=delay, eta=eta, priority=priority, headers=headers)
        return BoundTask(self, opts)


class BoundTask(Generic[P, R]):
    """A task together with per-call options, as returned by ``Task.options``."""

    def __init__(self, task: Task[P, R], options: SendOptions) -> None:
        self.task = task
        self.opts = options

    def send(self, *args: P.args, **kwargs: P.kwargs) -> str:
        message = self.task.message(args, kwargs, self.opts)
        self.task.app.broker.publish([message])
        return message.id

    def send_many(self, calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args]
                  ) -> list[str]:
        return _send_many(self.task, calls, self.opts)


def _send_many(
    task: Task[Any, Any],
    calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args],
    options: SendOptions | None,
) -> list[str]:
    now = time.time()
    queue, priority, eta, headers = task._resolve(options, now)
    name = task.name
    empty: dict[str, Any] = {}
    messages: list[Message] = []
    append = messages.append
    for call in calls:
        if type(call) is tuple:
            args, kwargs = call, empty
        elif isinstance(call, tuple | list):
            args, kwargs = tuple(call), empty
        elif isinstance(call, dict):
            args, kwargs = (), call
        elif isinstance(call, Args):
            args, kwargs = call.args, call.kwargs
        else:
            raise TypeError(
                f"send_many({name}): each call must be a tuple of arguments, a dict of "
                f"keyword arguments or hurtle.Args(...), got {type(call).__name__}"
            )
        append(Message(new_id(), name, queue, args, kwargs, 0, priority, eta, now, headers))
    if messages:
        task.app.broker.publish(messages)
    return [m.id for m in messages]
