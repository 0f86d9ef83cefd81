"""Task modules for each benchmarked system, imported only inside the worker and publisher
subprocesses (never by the driver), so that one peer's imports and patches touch no other; and
``one_by_one``, the publish loop of the peers that send one task per call."""

from __future__ import annotations

from collections.abc import Callable


def one_by_one(
    send: Callable[[int, int], object], count: int, progress: Callable[[int], None]
) -> int:
    """Call ``send(5, 6)`` ``count`` times, saying the progress every 1,000."""
    for i in range(1, count + 1):
        send(5, 6)
        if not i % 1000:
            progress(i)
    return count
