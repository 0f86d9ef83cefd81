"""The numbers of the cancel promise, shared by the canceller (``Hurtle.cancel``, ``hurtle
cancel``) and every worker (``worker.screen``): how long a cancellation is kept by default, and
how long ``cancel`` waits before it returns so that no task starts after that unchecked.

A worker checks a delivery against the cancellations when it fetches it, and again before its
task starts if more than ``WINDOW`` passed since; ``Hurtle.cancel`` waits ``WINDOW`` plus
``CANCEL_MARGIN`` after recording the cancellation. The two sides must agree, so these are
fixed, not settings.
"""

from __future__ import annotations

#: Seconds a cancellation is kept by default (``Hurtle.cancel``): a week.
CANCEL_TTL = 7 * 86400.0
#: Seconds a delivery may wait unstarted after the broker state it was checked against was
#: read; ``Hurtle.cancel`` waits this long (plus ``CANCEL_MARGIN``) before it returns.
WINDOW = 0.1
#: What ``Hurtle.cancel`` waits beyond ``WINDOW``: the time between a loop's clock read and the
#: start of the task it checked.
CANCEL_MARGIN = 0.05
