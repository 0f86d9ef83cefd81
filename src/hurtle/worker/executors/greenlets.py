"""``gevent`` and ``eventlet``: a pool of greenlets, for many tasks waiting on I/O at once.

Both are one ``GreenletExecutor`` (a ``PooledExecutor`` whose runners are greenlets) with a
different ``Backend``: how to import the library, patch the standard library, spawn a greenlet and
time a call out. A time-limited call is interrupted where it waits, by the library's ``Timeout``
raising ``TimeLimitExceeded`` in the greenlet.

Patching is the launcher's job (``patch``, called by ``hurtle worker`` before the user's module is
imported); ``import hurtle`` never patches anything. The executor refuses to start unpatched,
because its runners and the worker's own threads would then block one another.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

from ...errors import ConfigurationError
from ..processor import Job, late_limit
from .pooled import PooledExecutor


class Backend:
    """What the worker needs from one greenlet library."""

    def __init__(self, name: str) -> None:
        self.name = name

    def load(self) -> ModuleType:
        """The library, or a ``ConfigurationError`` saying how to install it."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # eventlet warns that it is deprecated
                return importlib.import_module(self.name)
        except ImportError as err:
            raise ConfigurationError(
                f"the {self.name} pool needs the {self.name} package, which is not installed "
                f"({err}): pip install 'hurtle[{self.name}]'"
            ) from None

    def patch(self) -> None:
        """Make the standard library cooperative (once, before the user's code is imported)."""
        lib = self.load()
        if self.name == "gevent":
            importlib.import_module("gevent.monkey").patch_all()
        else:
            lib.monkey_patch()

    def patched(self) -> bool:
        if self.name == "gevent":
            monkey = importlib.import_module("gevent.monkey")
            return bool(monkey.is_module_patched("threading"))
        patcher = importlib.import_module("eventlet.patcher")
        return bool(patcher.is_monkey_patched("thread"))

    def spawn(self, target: Callable[[], None], name: str) -> None:
        self.load().spawn(target)

    def timeout(self, seconds: float, error: BaseException) -> AbstractContextManager[Any]:
        timeout: AbstractContextManager[Any] = self.load().Timeout(seconds, error)
        return timeout


BACKENDS = {name: Backend(name) for name in ("gevent", "eventlet")}


def patch(pool: str) -> None:
    """Patch for ``pool`` if it is a greenlet pool; a no-op for every other pool."""
    backend = BACKENDS.get(pool)
    if backend is not None:
        backend.patch()


class GreenletExecutor(PooledExecutor):
    greenlets = True

    def __init__(
        self, backend: Backend, concurrency: int, *, min_concurrency: int | None = None
    ) -> None:
        backend.load()
        if not backend.patched():
            raise ConfigurationError(
                f"the {backend.name} pool needs the standard library patched by {backend.name} "
                f"before your tasks are imported: start it with `hurtle worker APP --pool "
                f"{backend.name}`, or patch first in your own launcher"
            )
        super().__init__(concurrency, min_concurrency=min_concurrency, spawn=backend.spawn)
        self.backend = backend
        self.runner_name = f"hurtle-{backend.name}"

    def limit(self, job: Job, call: Callable[[], Any]) -> Any:
        assert job.task.time_limit is not None
        with self.backend.timeout(job.task.time_limit, job.time_limit_error()):
            return late_limit(job, call)  # late: in case the task swallowed the interruption
