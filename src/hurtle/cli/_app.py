"""Finding the user's app from ``module:attribute`` on the command line."""

from __future__ import annotations

import importlib
import os
import sys

from ..app import Hurtle
from ..errors import ConfigurationError


def load_app(path: str) -> Hurtle:
    """Import ``module:attr`` (``attr`` defaults to ``app``) from the current directory."""
    module_name, _, attr = path.partition(":")
    attr = attr or "app"
    if not module_name:
        raise ConfigurationError(f"app path {path!r} names no module: use module:app")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ConfigurationError(
                f"cannot import {module_name!r} (from {path!r}): no such module in {cwd} "
                "or on PYTHONPATH"
            ) from None
        raise
    app = getattr(module, attr, None)
    if app is None:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(app, Hurtle):
        raise ConfigurationError(f"{path!r} is a {type(app).__name__}, not a hurtle.Hurtle app")
    return app
