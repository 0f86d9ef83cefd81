"""The worker: fetcher loop, executors, processor, acker and heartbeat."""

from .worker import Worker

__all__ = ["Worker"]
