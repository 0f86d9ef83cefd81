"""Helpers for testing code that uses hurtle (guide: ``docs/testing.md``).

* ``eager(app)``: a context manager in which each send runs its task in this process, through the
  real encoding and the app's middleware, before it returns (``eager.py``);
* ``drain(app)``: runs a real worker on the app's broker until its queues are idle, and says
  what ran (``drain.py``);
* ``pytest_plugin``: fixtures, enabled with ``pytest_plugins = ["hurtle.testing.pytest_plugin"]``.

Nothing here is imported by hurtle itself: a worker or a send never pays for it.
"""

from .drain import DrainTimeout, drain
from .eager import EagerBroker, eager
from .summary import Summary

__all__ = ["DrainTimeout", "EagerBroker", "Summary", "drain", "eager"]
