"""``Task``: a registered function that can be sent to a queue, and per-call options.

``add.send(1, 2)`` builds one frozen ``Message`` and publishes it; ``add.send_many(...)`` builds
a batch and publishes it in one round trip; ``add(1, 2)`` is still a plain local call.
``add.delay(1, 2)`` and ``add.apply_async((1, 2), countdown=10)`` are Celery's spellings of the
same sends, for code that moves over.

What can be checked at send time is checked there, once per call and not per message: options
(queue a queue name, priority an int from 0 to 9, delay, eta and expires finite seconds >= 0,
headers a dict of str keys to plain values) raise ``ConfigurationError``,
arguments that do not fit the function's signature raise ``ArgumentError`` (a ``TypeError``).
The signature is read once, at registration; a send checks the count of positional arguments
against a precomputed range and, only when keywords are given, their names.

Typing: ``add.send(1, "x")`` is caught by mypy (the task keeps its function's ``ParamSpec``). A
``ParamSpec`` cannot be turned into the tuple type of its positional arguments, so the tuple
items of ``send_many([(1, 2), ...])`` cannot be typed against the function; items built with
``add.args(1, 2)`` are (``add.send_many(add.args(i, i) for i in range(10))``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar, Unpack

from .arity import arity_of
from .debounce import DEBOUNCE, Debounce
from .errors import ArgumentError, ConfigurationError, Retry
from .fair import FairKey
from .handles import Handle
from .ids import new_id
from .limits import Limits
from .message import Message
from .names import check_queue_name, check_task_name
from .options import (
    NO_CONNECTION,
    CelerySendOptions,
    SendOptions,
    TaskOptions,
    call_args,
    celery_send,
    check_priority,
    check_seconds,
    checked,
    exception_classes,
)
from .sealing import keyring_for
from .sending import (
    Args,
    debounce_seconds,
    publish,
    publish_debounced,
    publish_unique,
    publish_with,
    send_batch,
)
from .workflows import Signature

if TYPE_CHECKING:
    from .app import Hurtle

P = ParamSpec("P")
R = TypeVar("R")
V = TypeVar("V")


def _or(given: V | None, setting: V) -> V:
    """A task's option: as given, or the app's setting when given as None."""
    return setting if given is None else given


class Task(Generic[P, R]):
    """A function registered with an app under ``name``."""

    def __init__(self, app: Hurtle, fn: Callable[P, R], name: str, options: TaskOptions) -> None:
        """Check ``options``: those given as None take the app's settings."""
        settings = app.settings
        queue = _or(options.get("queue"), settings.default_queue)
        retries = _or(options.get("retries"), settings.default_retries)
        retry_delay = _or(options.get("retry_delay"), settings.default_retry_delay)
        store_result = _or(options.get("store_result"), settings.store_results)
        result_ttl = _or(options.get("result_ttl"), settings.result_ttl)
        encrypt = _or(options.get("encrypt"), settings.encrypt)
        time_limit, expires = options.get("time_limit"), options.get("expires")
        retry_on = options.get("retry_on")
        check_task_name(name)
        queue = checked(name, check_queue_name, queue)
        if not isinstance(store_result, bool):
            raise ConfigurationError(
                f"task {name!r}: store_result must be True or False, got {store_result!r}"
            )
        check_seconds(name, result_ttl, "result_ttl")
        if result_ttl == 0:
            raise ConfigurationError(f"task {name!r}: result_ttl must be > 0 seconds")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ConfigurationError(f"task {name!r}: retries must be an int >= 0, got {retries!r}")
        check_seconds(name, retry_delay, "retry_delay")
        if time_limit is not None:
            check_seconds(name, time_limit, "time_limit")
            if time_limit == 0:
                raise ConfigurationError(f"task {name!r}: time_limit must be > 0 (or None)")
        if expires is not None:
            check_seconds(name, expires, "expires")
        keyring = keyring_for(name, encrypt, app.keyring)
        retry_for = None if retry_on is None else exception_classes(name, "retry_on", retry_on)
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retries = retries
        self.retry_delay = retry_delay
        #: The exceptions worth another attempt (and ``Retry``), or None: any exception.
        self.retry_on: tuple[type[BaseException], ...] | None = (
            None if retry_for is None else (Retry, *retry_for)
        )
        self.priority = check_priority(name, options.get("priority", 0))
        self.time_limit = time_limit
        #: Seconds after its send past which a message of this task is no longer started (a
        #: dead letter with the reason ``expired``), or None.
        self.expires = None if expires is None else float(expires)
        #: Whether outcomes are stored for ``Handle.result``, and for how many seconds.
        self.store_result = store_result
        self.result_ttl = float(result_ttl)
        limits = Limits(name, options)
        #: Rate, concurrency and uniqueness options, or None when the task uses none.
        self.limits: Limits | None = (
            limits if limits.rate or limits.concurrency or limits.unique_for else None
        )
        #: Whether this task's arguments and results are sealed (``hurtle.sealing``), and the
        #: app's keyring that seals them (None when they are not).
        self.encrypt = keyring is not None
        self.keyring = keyring
        window, debounce_key = options.get("debounce"), options.get("debounce_key")
        if window is not None:
            debounce = Debounce(name, fn, window, debounce_key)
            if keyring is not None:  # its keys tell nothing of sealed arguments
                debounce.keyed = keyring.digest
        elif debounce_key is not None:
            raise ConfigurationError(f"task {name!r}: debounce_key needs debounce as well")
        else:
            debounce = None
        #: The ``debounce`` option (``hurtle.debounce``), or None.
        self.debounce: Debounce | None = debounce
        fair_key, fair_weights = options.get("fair_key"), options.get("fair_weights")
        if fair_key is not None:
            fair = FairKey(name, fn, fair_key, fair_weights)
            if keyring is not None:  # its sub-queues' names tell nothing of sealed arguments
                fair.keyed = keyring.digest
        elif fair_weights is not None:
            raise ConfigurationError(f"task {name!r}: fair_weights needs fair_key as well")
        else:
            fair = None
        #: The ``fair_key`` option (``hurtle.fair``), or None.
        self.fair: FairKey | None = fair
        #: Whether a call names a key from its arguments (a debounce key, a fair key): one
        #: test per call for both.
        self._keyed = debounce is not None or fair is not None
        #: How a send of this task publishes when it is not a plain publish (unique locks, a
        #: debounce key), else None: one compare per send.
        self._publisher: Callable[[Task[Any, Any], list[Message]], list[str]] | None = (
            publish_debounced
            if debounce is not None
            else publish_unique
            if limits.unique_for is not None
            else None
        )
        if keyring is not None:
            limits.keyed = keyring.digest
        #: What the worker calls with a message's arguments: the function itself, or for an
        #: encrypted task what opens them first. Decided here, once: the worker's loops call
        #: it with no branch of their own.
        self.run: Callable[..., Any] = fn if keyring is None else keyring.opening(name, fn)
        self.arity = arity_of(fn)
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
        """The message one call would send, without sending it: with its unique lock if the
        task has ``unique_for``, its arguments sealed if the task is encrypted.

        Raises ``ArgumentError`` when the arguments do not fit the function's signature.
        """
        arity = self.arity
        if arity is not None and not arity.fits(args, kwargs):
            self._unfit(args, kwargs)
        now = time.time()
        queue, priority, eta, headers, expires = self._resolve(options, now)
        limits = self.limits
        unique, until = "", 0.0
        if limits is not None and limits.unique_for is not None:
            # the lock is named from the arguments before they are sealed, and ends at the
            # latest unique_for after the call was made
            unique, until = limits.unique_key_of(args, kwargs), now + limits.unique_for
        if self._keyed:  # keys named from the arguments before they are sealed
            if self.debounce is not None:
                headers[DEBOUNCE] = self.debounce.key_of(args, kwargs)
                eta = max(eta, now + debounce_seconds(self, options))
            if self.fair is not None:  # stored in its key's sub-queue
                queue = self.fair.queue_of(queue, args, kwargs)
        message = Message(
            id=new_id(),
            task=self.name,
            queue=queue,
            args=args,
            kwargs=kwargs,
            priority=priority,
            eta=eta,
            created=now,
            headers=headers,
            expires=expires,
            unique=unique,
            unique_until=until,
        )
        return message if self.keyring is None else self.keyring.seal_message(message)

    def unfit(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """Why a call with these arguments cannot bind to the function, or None if it can (or
        the function has no signature to check)."""
        arity = self.arity
        if arity is None or arity.fits(args, kwargs):
            return None
        return (
            f"the arguments of {self.name} do not fit: {arity.problem(args, kwargs)} (its "
            f"signature: {self.name}{arity.text()}; got {len(args)} positional argument(s)"
            + (f" and keyword(s) {', '.join(map(str, kwargs))}" if kwargs else "")
            + ")"
        )

    def _unfit(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> NoReturn:
        raise ArgumentError(f"cannot send: {self.unfit(args, kwargs)}; nothing was enqueued")

    def _resolve(
        self, options: SendOptions | None, now: float
    ) -> tuple[str, int, float, dict[str, Any], float]:
        """Queue, priority, eta, headers and expiry time of a call with ``options``
        (``SendOptions.resolve``)."""
        if options is None:
            expires = self.expires
            return self.queue, self.priority, 0.0, {}, 0 if expires is None else now + expires
        return options.resolve(now, self.queue, self.priority, self.expires)

    def send(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        """Enqueue one call; returns its handle (``.id``, ``.result()``) once the broker has it.

        With ``unique_for``, a call like one still waiting or running enqueues nothing and
        returns the handle of that one.
        """
        message = self.message(args, kwargs)
        if self._publisher is not None:  # unique locks, a debounce key
            return Handle(self._publisher(self, [message])[0], self.app, self)
        return Handle(publish(self.app, [message]), self.app, self)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        """Celery's name for ``send``: ``add.delay(1, 2)``."""
        return self.send(*args, **kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[CelerySendOptions],
    ) -> Handle[R]:
        """Celery's spelling of ``options(...).send(...)``: ``add.apply_async((1, 2),
        countdown=10)``.

        ``countdown`` is seconds from now (``delay``); ``eta`` a ``datetime`` or a Unix time
        (it wins over ``countdown``); ``expires`` seconds from now or a ``datetime``. A naive
        ``datetime`` is read in the local time zone (``datetime.timestamp``). Priorities run
        from 0 to 9, 9 first, as everywhere in hurtle. Any other option raises
        ``ConfigurationError`` saying what to write instead.
        """
        what = f"task {self.name!r}: apply_async"
        call, keywords = call_args(what, args, kwargs)
        return self.options(**celery_send(what, options)).send(*call, **keywords)

    def send_many(
        self, calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args]
    ) -> list[Handle[R]]:
        """Enqueue many calls in one batch; returns their handles in order.

        Each item is a tuple (or list) of positional arguments, a dict of keyword arguments, or an
        ``Args(*args, **kwargs)`` (``self.args(...)`` builds one that mypy checks against the
        function). If any call does not fit the signature (``ArgumentError``) or any argument
        cannot be encoded (``EncodeError``), nothing is enqueued.
        """
        return send_batch(self, calls, None)

    def args(self, *args: P.args, **kwargs: P.kwargs) -> Args:
        """One call's arguments for ``send_many``, type-checked against the function."""
        return Args(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> Signature[R]:
        """A signature of this call, for workflows: ``chain(add.s(1, 2), add.s(10))``.

        Not typed against the function: in a chain or chord, the result of the step before is
        put before these arguments when the call is made.
        """
        return Signature(self, args, kwargs)

    def signature(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[CelerySendOptions],
    ) -> Signature[R]:
        """Celery's long form of ``s``: ``add.signature((1, 2), countdown=10)`` is
        ``add.s(1, 2).options(delay=10)``; it takes ``apply_async``'s options."""
        what = f"task {self.name!r}: signature"
        call, keywords = call_args(what, args, kwargs)
        given = celery_send(what, options)
        if "connection" in given:
            raise ConfigurationError(f"{what}: {NO_CONNECTION}")
        return Signature(self, call, keywords, self.options(**given).opts if given else None)

    def options(
        self,
        *,
        queue: str | None = None,
        delay: float | None = None,
        eta: float | None = None,
        priority: int | None = None,
        headers: Mapping[str, Any] | None = None,
        expires: float | None = None,
        debounce: float | None = None,
        connection: object = None,
    ) -> BoundTask[P, R]:
        """This task with per-call options: ``add.options(delay=30, priority=9).send(1, 2)``.

        ``delay`` is seconds from the send, ``eta`` a Unix time (it wins over ``delay``); both
        must be finite and >= 0. ``priority`` is an int from 0 to 9. ``expires`` is seconds
        from the send after which the message is no longer started (the task's own
        ``expires`` otherwise). ``debounce`` is this call's window, for a task registered
        with ``debounce=`` (``hurtle.debounce``).

        ``connection`` (PostgreSQL broker only) is the application's own connection to the
        broker's database — psycopg's, a SQLAlchemy ``Connection`` or ``Session``, Django's
        ``connection`` —: the sends write their messages with it, in its open transaction, so
        that they run once it commits and never if it rolls back (docs/transactions.md).
        """
        try:
            opts = SendOptions(
                queue=queue,
                delay=delay,
                eta=eta,
                priority=priority,
                headers=headers,
                expires=expires,
                debounce=debounce,
            )
        except ConfigurationError as err:
            raise ConfigurationError(f"task {self.name!r}: {err}") from None
        if debounce is not None and self.debounce is None:
            raise ConfigurationError(
                f"task {self.name!r}: options(debounce=...) sets the window of a debounced "
                "task's call; register the task with @app.task(debounce=N) (and debounce_key=)"
            )
        if connection is not None:
            if self.debounce is not None:
                raise ConfigurationError(
                    f"task {self.name!r} is debounced: its calls cannot be sent in your "
                    "transaction (the record of the latest call of a key is not part of it, so "
                    "a rollback would leave older calls superseded by one that never was); "
                    "send after the commit"
                )
            return InTransaction(self, opts, connection)
        return BoundTask(self, opts)

    def _bound(self, opts: SendOptions, connection: object = None) -> BoundTask[P, R]:
        """This task with per-call options already checked (a signature's)."""
        if connection is not None:
            return InTransaction(self, opts, connection)
        return BoundTask(self, opts)


class BoundTask(Generic[P, R]):
    """A task together with per-call options, as returned by ``Task.options``."""

    def __init__(self, task: Task[P, R], options: SendOptions) -> None:
        self.task = task
        self.opts = options

    def send(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        task = self.task
        message = task.message(args, kwargs, self.opts)
        if task._publisher is not None:  # unique locks, a debounce key
            return Handle(task._publisher(task, [message])[0], task.app, task)
        return Handle(publish(task.app, [message]), task.app, task)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        """Celery's name for ``send``."""
        return self.send(*args, **kwargs)

    def send_many(
        self, calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args]
    ) -> list[Handle[R]]:
        return send_batch(self.task, calls, self.opts)

    def args(self, *args: P.args, **kwargs: P.kwargs) -> Args:
        """One call's arguments for ``send_many``, type-checked against the function."""
        return Args(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> Signature[R]:
        """A signature of this call with these options, for workflows (``Task.s``)."""
        return Signature(self.task, args, kwargs, self.opts)


class InTransaction(BoundTask[P, R]):
    """A task with per-call options and a connection (``Task.options(connection=...)``): its
    sends write their messages with that connection, in its open transaction
    (``Broker.publish_in``). Sends without a connection never come here."""

    def __init__(self, task: Task[P, R], options: SendOptions, connection: object) -> None:
        super().__init__(task, options)
        self.connection = connection

    def send(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        task = self.task
        message = task.message(args, kwargs, self.opts)
        return Handle(publish_with(task, [message], self.connection)[0], task.app, task)

    def send_many(
        self, calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args]
    ) -> list[Handle[R]]:
        return send_batch(self.task, calls, self.opts, self.connection)

    def s(self, *args: Any, **kwargs: Any) -> Signature[R]:
        raise ConfigurationError(f"task {self.task.name!r}: {NO_CONNECTION}")
