"""Where a suite finds its rows: every module of its rows package declares ``ROWS``, a list of
row declarations, and ``discover`` gathers them. A row is added by adding a module there (or a
declaration to one); nothing else lists rows.

The package may give ``ORDER``, the module names in the order their rows are run and shown; the
modules it does not name come after, by name. Modules whose name starts with ``_`` are helpers,
not rows.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ...errors import ConfigurationError


def modules(package: str) -> list[str]:
    """The row modules of ``package`` (dotted names), in run order."""
    pkg = importlib.import_module(package)
    found = {m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")}
    order: tuple[str, ...] = getattr(pkg, "ORDER", ())
    ranked = [n for n in order if n in found] + sorted(found.difference(order))
    return [f"{package}.{name}" for name in ranked]


def discover(package: str) -> list[Any]:
    """Every row declared in ``package``'s modules, in run order; a name declared twice is an
    error naming both modules."""
    rows: list[Any] = []
    where: dict[str, str] = {}
    for name in modules(package):
        for row in getattr(importlib.import_module(name), "ROWS", ()):
            if row.name in where:
                raise ConfigurationError(
                    f"row {row.name!r} is declared twice, in {where[row.name]} and {name}: "
                    "rename one"
                )
            where[row.name] = name
            rows.append(row)
    return rows
