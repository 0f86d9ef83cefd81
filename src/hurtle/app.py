"""``Hurtle``: the application object — a registry of tasks, a broker, middleware and settings.

There are no module globals: two apps in one process never see each other's tasks or broker.
``app.middleware`` is the built-in middleware in use (``_builtin_middleware``), then the user's in
the order added; workers made from the app (``hurtle worker`` too) run it, and ``send`` and
``send_many`` pass each batch through the ``before_publish`` hooks of those that define one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack, overload

from .brokers import Broker, make_broker
from .brokers.sharded import ShardedBroker, check_shards
from .cancels import CANCEL_MARGIN, CANCEL_TTL, WINDOW
from .errors import ConfigurationError
from .flow import COLLECT, collect
from .handles import GraphHandle, Handle
from .ids import check_message_ids
from .middleware import Middleware, overrides
from .middleware.retries import Retries
from .names import check_task_name
from .options import CelerySendOptions, TaskKeywords, task_options
from .sealing import Keyring, keyring_of
from .sending import send_by_name
from .settings import Settings, check_outbox, load_settings
from .task import Task

if TYPE_CHECKING:
    from .brokers.postgres.outbox import OutboxTable
    from .channels import AsyncSubscription, Channel, ChannelHub, LossCallback, Subscription
    from .periodic import Schedule, ScheduleOptions
    from .worker import Worker
    from .workflows import Signature

P = ParamSpec("P")
R = TypeVar("R")


class Hurtle:
    """A hurtle application.

    ``broker`` is a URL or a ``Broker``; without one, ``HURTLE_BROKER_URL`` is used, else the
    embedded ``sqlite:///hurtle.db``. Keyword arguments override any other setting (see
    ``hurtle.settings.Settings``). The broker is connected on first use.

    ``shards`` ({queue: number of shards}) stores each of those queues as that many queues of
    the broker, spread over a Redis Cluster's masters (``brokers/sharded.py``, "Sharded
    queues" in docs/brokers.md): every process of the application must name the same.
    """

    def __init__(
        self,
        broker: str | Broker | None = None,
        *,
        middleware: Iterable[Middleware] = (),
        shards: Mapping[str, int] | None = None,
        **settings: Any,
    ) -> None:
        #: The sharded queues and their numbers of shards (``ShardedBroker``), checked.
        self.shards: dict[str, int] = check_shards(shards) if shards is not None else {}
        if isinstance(broker, ShardedBroker):
            if shards is not None and self.shards != broker.shards:
                raise ConfigurationError(
                    f"shards={self.shards!r} disagrees with the shards of the ShardedBroker "
                    f"given ({broker.shards!r}): name the shards once, in one of them"
                )
            self.shards = broker.shards
        elif isinstance(broker, Broker) and self.shards:
            broker = ShardedBroker(broker, self.shards)
        if isinstance(broker, str):
            settings["broker_url"] = broker
        self.settings: Settings = load_settings(settings)
        check_outbox(
            broker.url if isinstance(broker, Broker) else self.settings.broker_url,
            self.settings.outbox,
        )
        self._outbox: OutboxTable | None = None
        #: What seals and opens the arguments and results of encrypted tasks
        #: (``encryption_keys``), or None without keys.
        self.keyring: Keyring | None = keyring_of(self.settings.encryption_keys)
        self._broker: Broker | None = broker if isinstance(broker, Broker) else None
        self._broker_lock = threading.Lock()
        self.tasks: dict[str, Task[Any, Any]] = {}
        #: Periodic tasks by schedule name (``periodic``); every worker's scheduler runs them.
        self.schedules: dict[str, Schedule] = {}
        self._channel_hub: ChannelHub | None = None
        # Channels open their own connections, from this URL (a given broker's, without secrets).
        self._channel_broker_url = broker.url if isinstance(broker, Broker) else None
        self._retries = Retries(self.settings.max_retry_delay)
        self._user_middleware: list[Middleware] = []
        #: The middleware whose ``before_publish`` a publish calls (empty: publishing pays
        #: nothing), kept up to date when middleware or tasks are added.
        self._publish_hooks: tuple[Middleware, ...] = ()
        for m in middleware:
            self.add_middleware(m)

    # -- middleware ------------------------------------------------------------------------

    def add_middleware(self, middleware: Middleware) -> None:
        """Add a middleware after those already registered (workers started later use it)."""
        if not isinstance(middleware, Middleware):
            raise ConfigurationError(
                f"middleware must be a hurtle.middleware.Middleware instance, got "
                f"{type(middleware).__name__}: subclass Middleware and pass an instance"
            )
        self._user_middleware.append(middleware)
        self._middleware_changed()

    @property
    def middleware(self) -> list[Middleware]:
        """The built-in middleware in use, then the user's, in order."""
        return self._builtin_middleware() + self._user_middleware

    def _builtin_middleware(self) -> list[Middleware]:
        """The built-in middleware switched on by this app's tasks and settings. Retries decides
        every failed call's outcome, so it is always in use (it costs nothing until a call
        fails). Debounce, results, limits and unique locks are made afresh on each call (they
        keep their worker's parts) and only when some task uses them, so that other tasks stay
        inline."""
        builtin: list[Middleware] = [self._retries]
        if self.settings.outbox:  # every worker offers to relay the outbox
            from .middleware.relay import OutboxRelay

            builtin.append(OutboxRelay())
        tasks = self.tasks.values()
        if any(t.debounce is not None for t in tasks):  # first: a call replaced takes no limit
            from .middleware.debounce import DebounceMiddleware

            builtin.append(DebounceMiddleware())
        if self.settings.store_results or any(t.store_result for t in tasks):
            from .middleware.results import Results

            builtin.append(Results(self))
        if any(t.limits is not None for t in tasks):
            from .middleware.limits import LimitsMiddleware, RateLimitMiddleware
            from .middleware.unique import UniqueMiddleware

            for m in (RateLimitMiddleware(), LimitsMiddleware(), UniqueMiddleware()):
                if any(m.applies_to(t) for t in tasks):
                    builtin.append(m)
        return builtin

    def _middleware_changed(self) -> None:
        self._publish_hooks = tuple(m for m in self.middleware if overrides(m, "before_publish"))

    def handle(self, id: str, task: Task[Any, Any] | None = None) -> Handle[Any]:
        """The handle of a message sent earlier, from its id (and its task, if known: then
        ``result`` on a task that keeps no results fails at once)."""
        return Handle(id, self, task)

    def AsyncResult(self, id: str) -> Handle[Any]:
        """Celery's name for ``handle``: ``app.AsyncResult(id).get(timeout=10)``."""
        return Handle(id, self)

    def send_task(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[CelerySendOptions],
    ) -> Handle[Any]:
        """Send a call of the task named ``name``, registered here or not (another service's):
        ``app.send_task("tasks.add", args=(1, 2), countdown=10)``, with ``apply_async``'s
        options, checked alike. A task registered here is sent as ``apply_async`` sends it
        (its queue, its checks of the arguments); another name goes to ``queue=`` or the
        app's default queue, with priority 0 and no expiry unless given."""
        task = self.tasks.get(check_task_name(name))
        if task is not None:
            return task.apply_async(args, kwargs, **options)
        return send_by_name(self, name, args, kwargs, options)

    def graph(self, after: Mapping[str, Iterable[str]], /, **nodes: Signature[Any]) -> GraphHandle:
        """Send a graph of signatures: ``app.graph({"b": ["a"], "c": ["a"], "d": ["b", "c"]},
        a=fetch.s(url), b=resize.s(), c=thumb.s(), d=publish.s())`` runs ``a``, then ``b`` and
        ``c`` with its result, then ``d`` with the list of theirs; the handle's result is the
        dict of the results of the nodes nothing waits for (``hurtle.graphs``)."""
        from .graphs import graph

        return graph(after, **nodes).send()

    def builtin(self, name: str) -> Task[Any, Any] | None:
        """The task every app has under ``name`` (``hurtle.collect``, which workflows use),
        registered on first use; None for any other name."""
        if name != COLLECT:
            return None
        task = self.tasks.get(COLLECT)
        if task is None:
            task = self.task(name=COLLECT, encrypt=self.keyring is not None)(collect)
        return task

    def __repr__(self) -> str:
        return f"<Hurtle broker={self.settings.broker_url!r} tasks={len(self.tasks)}>"

    @property
    def broker(self) -> Broker:
        """The broker, connected on first use."""
        broker = self._broker
        return broker if broker is not None else self.connect()

    def connect(self, *, create: bool = True) -> Broker:
        """Connect the broker now (once; later calls return it). ``create=False`` opens only a
        SQLite file that exists, else raises ``ConfigurationError`` naming its absolute path:
        what only reads, such as ``hurtle status``, never leaves an empty file behind."""
        with self._broker_lock:
            if self._broker is None:
                broker = make_broker(
                    self.settings.broker_url,
                    heartbeat_timeout=self.settings.heartbeat_timeout,
                    dead_letter_max=self.settings.dead_letter_max,
                    dead_letter_ttl=self.settings.dead_letter_ttl,
                    max_recoveries=self.settings.max_recoveries,
                    create=create,
                )
                self._broker = ShardedBroker(broker, self.shards) if self.shards else broker
            return self._broker

    @property
    def outbox(self) -> OutboxTable | None:
        """The outbox (``outbox=``: sends with ``connection=`` write there), or None."""
        if self._outbox is None and self.settings.outbox:
            from .brokers.postgres.outbox import OutboxTable

            with self._broker_lock:
                self._outbox = self._outbox or OutboxTable(self.settings.outbox)
        return self._outbox

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, /, **options: Unpack[TaskKeywords]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Unpack[TaskKeywords]) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(retries=3, ...)``, with
        the options of ``hurtle.options.TaskKeywords`` (each typed there, for type checkers).

        ``store_result=True`` keeps each outcome ``result_ttl`` seconds for ``Handle.result``
        (defaults: the app's ``store_results`` and ``result_ttl`` settings).

        Limits and uniqueness (``hurtle.limits``): ``rate_limit="50/s"`` (``/m``, ``/h``),
        ``rate_limit_key=``, ``concurrency_limit=N``, ``concurrency_key=``, ``unique_for=``
        seconds, ``unique_key=``; each key option is a callable of the task's arguments. A
        call that raises ``hurtle.Throttle`` cuts its rate limit for every worker, which then
        climbs back (``hurtle.adaptive``); ``on_429=True`` makes an exception carrying an HTTP
        429 a ``Throttle`` (or a callable of the exception decides).

        ``debounce=`` seconds (``hurtle.debounce``): of the calls of one key sent within that
        many seconds of each other, only the last runs, ``debounce`` seconds after it was
        sent; ``debounce_key=`` is the name of a parameter whose value is the key, or a
        callable of the task's arguments returning it (without one, every call shares a key).

        ``fair_key=`` (``hurtle.fair``): the name of a parameter whose value is the call's key
        (a tenant), or a callable of the task's arguments returning it; each key's calls wait
        apart and workers take the keys of a queue in turn, ``fair_weights={key: shares}``
        giving some more of each batch.

        ``expires=`` seconds: a message not started that long after its send is not run; it
        becomes a dead letter with the reason ``expired`` (its handle's state: ``expired``).

        ``encrypt=True`` seals the task's arguments where they are sent and its results before
        they are stored (AES-GCM with the app's ``encryption_keys``; default: the app's
        ``encrypt`` setting); see ``hurtle.sealing``.

        ``retry_on=(ConnectionError, ...)``: only these exceptions are retried; any other one
        makes the message a dead letter at once. Celery's ``max_retries``, ``autoretry_for``,
        ``retry_backoff``, ``ignore_result``, ``acks_late=True`` and ``bind=False`` are taken
        with their hurtle meaning (``hurtle.options.celery_task``); other Celery options raise
        ``ConfigurationError`` naming hurtle's.
        """

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task_name, given = task_options(func, options)
            if task_name in self.tasks and self.tasks[task_name].fn is not func:
                raise ConfigurationError(
                    f"two tasks are named {task_name!r}; give one of them name=..."
                )
            t: Task[Any, Any] = Task(self, func, task_name, given)
            self.tasks[task_name] = t
            self._middleware_changed()  # built-ins may depend on task options
            return t

        if fn is not None:
            return register(fn)
        return register

    @overload
    def periodic(self, task: Task[P, R], /, **options: Unpack[ScheduleOptions]) -> Schedule: ...

    @overload
    def periodic(
        self, /, **options: Unpack[ScheduleOptions]
    ) -> Callable[[Task[P, R]], Task[P, R]]: ...

    def periodic(
        self, task: Task[Any, Any] | None = None, /, **options: Unpack[ScheduleOptions]
    ) -> Any:
        """Run a registered task on a schedule: ``app.periodic(task, cron="*/5 * * * *",
        tz="Europe/Paris")``, or ``every=`` seconds; as a decorator, above ``@app.task``. The
        options are those of ``hurtle.periodic.ScheduleOptions``.

        ``name`` defaults to the task's; two schedules of one task need names of their own.
        ``catch_up=False`` skips a tick missed while no worker ran. See ``hurtle.periodic``.
        """
        from .periodic import make_schedule

        def register(t: Task[Any, Any]) -> Schedule:
            if not isinstance(t, Task) or self.tasks.get(t.name) is not t:
                raise ConfigurationError(
                    f"app.periodic needs a task registered on this app, got {t!r}: register it "
                    "with @app.task first (as decorators, @app.periodic goes above @app.task)"
                )
            schedule = make_schedule(t, options)
            if schedule.name in self.schedules:
                raise ConfigurationError(
                    f"two schedules are named {schedule.name!r}; give one of them name=..."
                )
            self.schedules[schedule.name] = schedule
            return schedule

        if task is not None:
            return register(task)

        def decorate(t: Task[Any, Any]) -> Task[Any, Any]:
            register(t)
            return t

        return decorate

    # -- control ---------------------------------------------------------------------------

    def cancel(self, *ids: str | Handle[Any], ttl: float = CANCEL_TTL) -> None:
        """Cancel messages by id (or handle): one not started yet is never run, by any worker,
        for ``ttl`` seconds (a week by default; raise it for messages due later than that).

        A cancelled message becomes a dead letter with the reason ``cancelled`` instead of
        running, and its handle reads ``cancelled`` if its task keeps results. The
        cancellations live in the broker: they survive worker restarts.

        A task already running learns of it within a second (its worker asks, once per half
        second, about the tasks that ran through the last half second): it is stopped where
        its pool can (``TaskCancelled`` raised in it by the solo pool on a process's main
        thread — ``hurtle worker``, each ``--processes`` child — and ``asyncio.CancelledError``
        in an ``async def`` task of the asyncio pool), and elsewhere sees
        ``hurtle.current().cancelled`` turn true. Whatever it does then, its outcome is
        ``cancelled`` as above, without a retry. This call does not wait for that.

        The promise holds from when this returns: a message whose task had not started by
        then never runs. A worker checks a delivery against the cancellations when it fetches
        it and again before its task starts if more than ``hurtle.cancels.WINDOW``
        (0.1 s) passed since, so this call waits that long after recording the cancellation:
        a task that starts later was checked after it. (One that started within that wait was
        not cancelled in time; its handle says how it ended.)"""
        wanted = [i.id if isinstance(i, Handle) else i for i in ids]
        check_message_ids(wanted)
        if wanted:
            self.broker.cancel(wanted, ttl)
            time.sleep(WINDOW + CANCEL_MARGIN)

    def pause(self, queue: str) -> None:
        """Stop every worker from fetching ``queue`` until ``resume``; tasks already fetched
        finish. The flag lives in the broker, so workers started later see it too."""
        self.broker.pause(queue)

    def resume(self, queue: str) -> None:
        """Let workers fetch ``queue`` again."""
        self.broker.resume(queue)

    def queues(self) -> list[str]:
        """The queues this app's tasks name, and the default queue."""
        names = {t.queue for t in self.tasks.values()}
        names.add(self.settings.default_queue)
        return sorted(names)

    def fair_weights(self, queues: Sequence[str]) -> dict[str, int] | None:
        """None when no task of this app has a ``fair_key`` (``hurtle.fair``); else the weights
        of the weighted keys, by their sub-queues of ``queues`` (every queue a worker reads is
        then read by turns: a fair task may be sent to any queue)."""
        fair = [t.fair for t in self.tasks.values() if t.fair is not None]
        if not fair:
            return None
        return {name: w for f in fair for q in queues for name, w in f.weights_in(q).items()}

    def worker(self, **options: Any) -> Worker:
        """A worker for this app; see ``hurtle.worker.Worker`` for the options."""
        from .worker import Worker

        return Worker(self, **options)

    # -- channels (pub/sub): see hurtle.channels ---------------------------------------------

    @property
    def _channels(self) -> ChannelHub:
        hub = self._channel_hub
        if hub is None:
            from .channels import ChannelHub

            with self._broker_lock:
                if self._channel_hub is None:
                    self._channel_hub = ChannelHub(self._channel_url)
                hub = self._channel_hub
        return hub

    def _channel_url(self) -> str:
        return self._channel_broker_url or self.settings.broker_url

    def channel(
        self, name: str, *, buffer: int | None = None, flush_interval: float | None = None
    ) -> Channel:
        """The channel ``name``: buffered by default (1,000 messages or 5 ms); ``buffer=0``
        sends each ``publish`` at once."""
        from .channels import DEFAULT_BUFFER, DEFAULT_FLUSH_INTERVAL

        return self._channels.channel(
            name,
            buffer=DEFAULT_BUFFER if buffer is None else buffer,
            flush_interval=DEFAULT_FLUSH_INTERVAL if flush_interval is None else flush_interval,
        )

    def subscribe(self, *names: str, on_loss: LossCallback | None = None) -> Subscription:
        """A subscription to channels and glob patterns (``"prices.*"``)."""
        return self._channels.subscribe(names, on_loss=on_loss)

    def subscribe_async(
        self, *names: str, on_loss: LossCallback | None = None
    ) -> AsyncSubscription:
        """The same for asyncio: ``async for msg in app.subscribe_async("prices.*")``."""
        return self._channels.subscribe_async(names, on_loss=on_loss)

    def close(self) -> None:
        """Flush the channels and close the broker connection, if one was made."""
        hub = self._channel_hub
        if hub is not None:
            hub.close()
        with self._broker_lock:
            if self._broker is not None:
                self._broker.close()
                self._broker = None
