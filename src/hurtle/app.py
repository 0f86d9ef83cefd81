"""``Hurtle``: the application object — a registry of tasks, a broker and settings.

There are no module globals: two apps in one process never see each other's tasks or broker.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .brokers import Broker, make_broker
from .errors import ConfigurationError
from .limits import KeyFunction
from .settings import Settings, load_settings
from .task import Task

if TYPE_CHECKING:
    from .middleware import Middleware
    from .worker import Worker

P = ParamSpec("P")
R = TypeVar("R")


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


class Hurtle:
    """A hurtle application.

    ``broker`` is a URL or a ``Broker``; without one, ``HURTLE_BROKER_URL`` is used, else the
    embedded ``sqlite:///hurtle.db``. Keyword arguments override any other setting (see
    ``hurtle.settings.Settings``). The broker is connected on first use.
    """

    def __init__(self, broker: str | Broker | None = None, **settings: Any) -> None:
        if isinstance(broker, str):
            settings["broker_url"] = broker
        self.settings: Settings = load_settings(settings)
        self._broker: Broker | None = broker if isinstance(broker, Broker) else None
        self._broker_lock = threading.Lock()
        self.tasks: dict[str, Task[Any, Any]] = {}

    def __repr__(self) -> str:
        return f"<Hurtle broker={self.settings.broker_url!r} tasks={len(self.tasks)}>"

    @property
    def broker(self) -> Broker:
        """The broker, connected on first use."""
        broker = self._broker
        if broker is None:
            with self._broker_lock:
                if self._broker is None:
                    self._broker = make_broker(
                        self.settings.broker_url,
                        heartbeat_timeout=self.settings.heartbeat_timeout,
                        dead_letter_max=self.settings.dead_letter_max,
                        dead_letter_ttl=self.settings.dead_letter_ttl,
                        max_recoveries=self.settings.max_recoveries,
                    )
                broker = self._broker
        return broker

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        retries: int | None = None,
        retry_delay: float | None = None,
        priority: int = 0,
        time_limit: float | None = None,
        rate_limit: str | None = None,
        rate_limit_key: KeyFunction | None = None,
        concurrency_limit: int | None = None,
        concurrency_key: KeyFunction | None = None,
        unique_for: float | None = None,
        unique_key: KeyFunction | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        retries: int | None = None,
        retry_delay: float | None = None,
        priority: int = 0,
        time_limit: float | None = None,
        rate_limit: str | None = None,
        rate_limit_key: KeyFunction | None = None,
        concurrency_limit: int | None = None,
        concurrency_key: KeyFunction | None = None,
        unique_for: float | None = None,
        unique_key: KeyFunction | None = None,
    ) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(retries=3, ...)``.

        Limits and uniqueness (``hurtle.limits``): ``rate_limit="50/s"`` (``/m``, ``/h``),
        ``rate_limit_key=``, ``concurrency_limit=N``, ``concurrency_key=``, ``unique_for=``
        seconds, ``unique_key=``; each key option is a callable of the task's arguments.
        """

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name or _default_name(func)
            if task_name in self.tasks and self.tasks[task_name].fn is not func:
                raise ConfigurationError(
                    f"two tasks are named {task_name!r}; give one of them name=..."
                )
            t: Task[Any, Any] = Task(
                self,
                func,
                name=task_name,
                queue=queue or self.settings.default_queue,
                retries=self.settings.default_retries if retries is None else retries,
                retry_delay=(
                    self.settings.default_retry_delay if retry_delay is None else retry_delay
                ),
                priority=priority,
                time_limit=time_limit,
                rate_limit=rate_limit,
                rate_limit_key=rate_limit_key,
                concurrency_limit=concurrency_limit,
                concurrency_key=concurrency_key,
                unique_for=unique_for,
                unique_key=unique_key,
            )
            self.tasks[task_name] = t
            return t

        if fn is not None:
            return register(fn)
        return register

    def _builtin_middleware(self) -> list[Middleware]:
        """The built-in middleware the registered tasks' options switch on."""
        from .middleware.limits import LimitsMiddleware, RateLimitMiddleware
        from .middleware.unique import UniqueMiddleware

        out: list[Middleware] = []
        for m in (RateLimitMiddleware(), LimitsMiddleware(), UniqueMiddleware()):
            if any(m.applies_to(t) for t in self.tasks.values()):
                out.append(m)
        return out

    def queues(self) -> list[str]:
        """The queues this app's tasks name, and the default queue."""
        names = {t.queue for t in self.tasks.values()}
        names.add(self.settings.default_queue)
        return sorted(names)

    def worker(self, **options: Any) -> Worker:
        """A worker for this app; see ``hurtle.worker.Worker`` for the options."""
        from .worker import Worker

        return Worker(self, **options)

    def close(self) -> None:
        """Close the broker connection, if one was made."""
        with self._broker_lock:
            if self._broker is not None:
                self._broker.close()
                self._broker = None
