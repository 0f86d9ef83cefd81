"""Fair shares per key (``@app.task(fair_key=..., fair_weights=...)``): the option, checked once
at registration, and which sub-queue a call goes to.

A fair task's call is stored in a sub-queue of its queue named from the queue and its key
(``names.fair_queue``: ``q~f`` and a hash of the key), not in the queue itself. A worker that
reads a queue some fair task is sent to reads it through ``brokers.fair_consumer.FairConsumer``,
which finds the queue's live sub-queues and fetches from them in turn, each key ``weight``
shares of a batch (1 unless ``fair_weights`` names it): a key that enqueued 100,000 calls does
not delay one that enqueued 10. Each call is still one message of the broker with every
guarantee of one (acknowledgement, retries, dead letters, recovery, unique locks, results).

The key is ``fair_key=``: a callable of the task's arguments returning the key, or the name of
one of its parameters (its value is the key). A key is used as text (``str(key)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .arity import CallKey
from .counts import check_counts
from .names import fair_queue

#: Most shares of a batch one key may be weighted with.
MAX_WEIGHT = 1000


class FairKey(CallKey):
    """A task's checked ``fair_key`` and ``fair_weights`` options."""

    __slots__ = ("task", "weights")

    def __init__(
        self, task: str, fn: Callable[..., Any], key: object, weights: object = None
    ) -> None:
        self.task = task
        #: Shares of a batch per key (as text); a key not named here has one.
        self.weights: dict[str, int] = check_weights(task, weights)
        super().__init__(task, fn, key, "fair_key", "tenant", required=True)

    def key_of(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The fair key of a call with these arguments, as text."""
        return self.text_of(args, kwargs)

    def queue_of(self, queue: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The sub-queue of ``queue`` that a call with these arguments is stored in."""
        return fair_queue(queue, self.key_of(args, kwargs))

    def weights_in(self, queue: str) -> dict[str, int]:
        """``weights`` by the sub-queue of ``queue`` each weighted key is stored in."""
        keyed = self.keyed
        return {
            fair_queue(queue, key if keyed is None else keyed(key.encode())): weight
            for key, weight in self.weights.items()
        }


def check_weights(task: str, weights: object) -> dict[str, int]:
    """``fair_weights=`` as {key as text: whole number from 1 to ``MAX_WEIGHT``}."""
    if weights is None:
        return {}
    return check_counts(
        weights,
        MAX_WEIGHT,
        what=f"task {task!r}: fair_weights",
        shape="key -> weight, e.g. {'tenant-a': 3}",
        rule="a weight is a whole number of shares",
    )
