"""Concurrency modes as executors behind one interface (``base.Executor``)."""

from __future__ import annotations

from ...errors import ConfigurationError
from .base import Executor

POOLS = ("solo", "threads")


def make_executor(pool: str, concurrency: int, *, max_batch: int = 1000) -> Executor:
    """The executor for a ``--pool`` name."""
    if pool == "solo":
        from .solo import SoloExecutor

        return SoloExecutor(max_batch=max_batch)
    if pool == "threads":
        from .threads import ThreadsExecutor

        return ThreadsExecutor(concurrency)
    raise ConfigurationError(f"unknown pool {pool!r}: choose one of {', '.join(POOLS)}")


__all__ = ["POOLS", "Executor", "make_executor"]
