"""Rides: the outcomes the solo loop's prefetch carries to the broker instead of the acker's
thread (``Fetcher.rides``, ``Consumer.prefetch_with_acks``) — what one acknowledgement call
of a flush would carry — and what goes back to the acker when a ride was not recorded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..brokers import Delivery, Lock, Ride, StoredResult, StoredResults, UniqueLocks

if TYPE_CHECKING:
    from .acker import Acker


def ride_of(
    acks: list[Delivery],
    with_results: list[tuple[Delivery, StoredResult]],
    batches: list[tuple[list[Delivery], StoredResults]],
    loose: list[Lock],
    batched: list[UniqueLocks],
) -> Ride:
    """One acknowledgement call's outcomes: record i rides with delivery i (stored only while
    it is held), the plain acknowledgements after those with a record, the locks in one."""
    parts: list[Sequence[Lock]] = [*([loose] if loose else []), *batched]
    locks = UniqueLocks.join(parts) if parts else ()
    if not (with_results or batches):
        return Ride(acks, (), locks)
    delivered = [d for d, _ in with_results]
    records: list[Sequence[StoredResult]] = [r for _, r in batches]
    if with_results:
        records.insert(0, [r for _, r in with_results])
    for batch, _ in batches:
        delivered += batch
    return Ride(delivered + acks, StoredResults.join(records), locks)


def give_back(acker: Acker, ride: Ride) -> None:
    """Return a ride that was not recorded to ``acker``, to be flushed again."""
    n = len(ride.results)
    if n:
        acker.ack_many_with_results(ride.deliveries[:n], ride.results)
    acker.give_back(ride.deliveries[n:])
    if isinstance(ride.locks, UniqueLocks):
        acker.release_unique_batch(ride.locks)
    else:
        acker.release_uniques(list(ride.locks))
