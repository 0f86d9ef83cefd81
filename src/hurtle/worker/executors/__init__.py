"""Concurrency modes as executors behind one interface (``base.Executor``)."""

from __future__ import annotations

from ...errors import ConfigurationError
from .base import Executor

POOLS = ("solo", "threads", "asyncio", "gevent", "eventlet")


def make_executor(
    pool: str, concurrency: int, *, min_concurrency: int | None = None, max_batch: int = 1000
) -> Executor:
    """The executor for a ``--pool`` name; ``min_concurrency`` lets a pool scale itself."""
    if pool == "solo":
        from .solo import SoloExecutor

        return SoloExecutor(max_batch=max_batch)
    if pool == "threads":
        from .threads import ThreadsExecutor

        return ThreadsExecutor(concurrency, min_concurrency=min_concurrency, max_batch=max_batch)
    if pool == "asyncio":
        from .aio import AsyncioExecutor

        return AsyncioExecutor(concurrency)
    if pool in ("gevent", "eventlet"):
        from .greenlets import BACKENDS, GreenletExecutor

        return GreenletExecutor(BACKENDS[pool], concurrency, min_concurrency=min_concurrency)
    raise ConfigurationError(f"unknown pool {pool!r}: choose one of {', '.join(POOLS)}")


__all__ = ["POOLS", "Executor", "make_executor"]
