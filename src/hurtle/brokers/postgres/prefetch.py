"""``Prefetch``: a solo worker's next claim, run on a thread of its own while its batch runs.

A solo worker calls ``Consumer.prefetch`` before it runs a batch, and the claim of the next one
then waits for the server (its statements, its commit) while the tasks run: the thread spends
that time in libpq, without the GIL. The worker's next fetch takes what it claimed.

Acknowledgements handed to a fetch that finds a prefetched batch are owed: they ride with the
next claim (the one the worker prefetches as soon as that fetch returns), in its transaction, as
the acknowledgements of a solo worker always have. Until it commits their rows stay in the
worker's name; a worker that dies meanwhile has them delivered again, as it would any batch it
had not acknowledged yet. A claim that fails gives its owed acknowledgements back to the next
one, and the consumer's ``close`` records those still owed before it hands back what it holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..records import Delivery

#: ``claim(max_count, settle)``: settle ``settle`` and claim up to ``max_count`` in one
#: transaction; returns the deliveries and the batch's cancellations flag.
Claim = Callable[[int, Sequence[int]], tuple[list[Delivery], bool]]


class _Job:
    """One claim on its thread: its result or its error, once ``done`` is set."""

    def __init__(self, claim: Claim, max_count: int, settle: list[int]) -> None:
        self.settle = settle
        self.max_count = max_count
        self.result: tuple[list[Delivery], bool] = ([], False)
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._claim = claim
        threading.Thread(target=self._run, name="hurtle-prefetch", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._claim(self.max_count, self.settle)
        except BaseException as err:  # handed to the thread that collects it
            self.error = err
        finally:
            self.done.set()


class Prefetch:
    """The claim in flight (one at most) and the acknowledgements owed to the next claim."""

    def __init__(self, claim: Claim) -> None:
        self._claim = claim
        self._job: _Job | None = None
        #: Receipts acknowledged and not recorded yet: settled by the next claim.
        self.owed: list[int] = []

    @property
    def pending(self) -> bool:
        return self._job is not None

    def start(self, max_count: int) -> None:
        """Claim up to ``max_count`` on a thread, settling what is owed; one claim at a time."""
        if self._job is not None or max_count <= 0:
            return
        owed, self.owed = self.owed, []
        self._job = _Job(self._claim, max_count, owed)

    def owe(self, receipts: Sequence[int]) -> None:
        self.owed.extend(receipts)

    def take_owed(self, settle: Sequence[int]) -> list[int]:
        """What is owed, with ``settle``, for a claim made here and now (``give_back`` if it
        fails)."""
        owed, self.owed = self.owed, []
        return [*owed, *settle] if owed else list(settle)

    def give_back(self, receipts: Sequence[int]) -> None:
        """Receipts a failed claim did not record: owed again, ahead of newer ones."""
        self.owed[:0] = receipts

    def collect(self) -> tuple[list[Delivery], bool, int]:
        """Wait for the claim in flight: ``(its deliveries, their cancellations flag, how many
        it asked for)``. Its error is raised here, what it owed given back first."""
        job = self._job
        assert job is not None
        job.done.wait()
        self._job = None
        if job.error is not None:
            self.give_back(job.settle)
            raise job.error
        deliveries, cancellations = job.result
        return deliveries, cancellations, job.max_count
