"""What a table of whole numbers per name may be (a sharded queue's shards, a fair key's
weight): the one check, worded for error messages. It sits beside ``names``, under every
module that takes such a table."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .errors import ConfigurationError


def check_counts(
    counts: object,
    most: int,
    *,
    what: str,
    shape: str,
    rule: str,
    name: Callable[[object], str] = str,
) -> dict[str, int]:
    """``counts`` ({name: whole number from 1 to ``most``}), checked: each name as ``name``
    returns it, each number an int (not a bool); else a ``ConfigurationError`` that says
    ``what must be a dict of shape`` or names the value, ``what[name] is value: rule from 1 to
    most``."""
    if not isinstance(counts, Mapping):
        raise ConfigurationError(f"{what} must be a dict of {shape}, got {type(counts).__name__}")
    checked: dict[str, int] = {}
    for key, count in counts.items():
        text = name(key)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= most:
            raise ConfigurationError(
                f"{what}[{key!r:.40}] is {count!r:.40}: {rule} from 1 to {most}"
            )
        checked[text] = count
    return checked
