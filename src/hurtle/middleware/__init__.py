"""Cross-cutting features, each in its own module, hooked around every task call.

A middleware subclasses ``Middleware`` and overrides only the hooks it needs; the processor calls
none of them when an app has no middleware, so the hot path pays nothing for features not used.
"""

from __future__ import annotations

from typing import Any

from ..message import Message


class Middleware:
    """No-op hooks; override what you need."""

    def before_process(self, message: Message) -> None:
        """Called before the task runs; raising ``Reject`` or ``Retry`` here skips the call."""

    def after_process(self, message: Message, result: Any, error: BaseException | None) -> None:
        """Called after the task returned (``error`` is None) or raised."""


__all__ = ["Middleware"]
