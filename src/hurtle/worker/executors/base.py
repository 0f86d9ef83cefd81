"""The executor interface: how fetched deliveries get run, whatever the concurrency mode.

The worker's fetcher asks an executor how many deliveries it can take (``wait_for_capacity``),
fetches at most that many, and hands them over (``submit``). On stop, the executor stops starting
new deliveries, lets running ones finish for up to a deadline, and returns what it never started
so that the worker can give it back to the broker.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from ...brokers import Delivery

Process = Callable[[Delivery], None]


class Executor(abc.ABC):
    #: Deliveries that may run at once.
    concurrency: int

    @abc.abstractmethod
    def start(self, process: Process) -> None:
        """Get ready to run deliveries with ``process``."""

    @abc.abstractmethod
    def wait_for_capacity(self, timeout: float) -> int:
        """How many more deliveries to fetch now; waits up to ``timeout`` while that is 0."""

    @abc.abstractmethod
    def submit(self, deliveries: list[Delivery]) -> None:
        """Run these deliveries (the solo executor runs them before returning)."""

    @abc.abstractmethod
    def idle(self) -> bool:
        """True when nothing is running or waiting to run."""

    @abc.abstractmethod
    def stop(self, timeout: float) -> list[Delivery]:
        """Start nothing new, wait up to ``timeout`` for running ones; return the unstarted."""

    @abc.abstractmethod
    def abort(self) -> list[Delivery]:
        """Stop at once: return every delivery not finished, running ones included."""
