"""Retry policy: exponential backoff with jitter, and the message of the next attempt."""

from __future__ import annotations

import random
import time

import msgspec

from ..message import Message


def backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds before attempt ``attempt + 1``: ``base * 2**attempt``, capped, with ±25% jitter."""
    delay = min(base * (2.0 ** min(attempt, 62)), cap)
    return max(delay * random.uniform(0.75, 1.25), 0.0)


def next_attempt(message: Message, delay: float, error: str) -> Message:
    """The message to enqueue for the next attempt, due ``delay`` seconds from now."""
    headers = dict(message.headers)
    headers["error"] = error[:1000]
    return msgspec.structs.replace(
        message, attempt=message.attempt + 1, eta=time.time() + delay, headers=headers
    )
