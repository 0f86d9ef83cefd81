"""``nats://``: hurtle on NATS JetStream (``broker.py``)."""

from __future__ import annotations

from .broker import NatsBroker

__all__ = ["NatsBroker"]
