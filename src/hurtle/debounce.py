"""Debounced tasks (``@app.task(debounce=5, debounce_key=...)``): the option, checked once at
registration, and what a call carries and leaves in the broker.

Of the calls of one key sent within ``debounce`` seconds of each other, only the last runs. A
call is sent due ``debounce`` seconds later (as a ``delay``), naming its key in the header
``DEBOUNCE``; its publisher then records it as the latest message of that key in the broker
(``Broker.put_latest``, one call per batch; the last writer wins) for ``debounce`` plus
``LATEST_MARGIN`` seconds: its id and when it was made (``latest_value``). When a worker
fetches debounced messages it reads the latest records of their keys that are not their
calls' own in one call per batch (``Broker.get_other_latest``: the usual answer is none); one
whose key's record names another call made no earlier than itself
was superseded: it is acknowledged without running (``middleware.debounce``). A record of an
earlier call (the call's own record not written yet when it was fetched: a window shorter than
the time between its publish and its record) lets it run: the last call is never dropped for
an older one. (On Redis a worker reads no records at all while its queue's flag says no
record ever replaced another call's, ``Consumer.unreplaced``: such a call whose later call's
record was its key's first runs too.) A key whose
record is missing (expired, or never written because the send failed after its publish) runs
every call that reaches the worker: a call is never lost to a missing record.

The key is ``debounce_key=``: a callable of the task's arguments returning the key, or the name
of one of its parameters (its value is the key). Without one, all calls of the task share one
key. Keys are per task and per queue.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .arity import CallKey
from .errors import ConfigurationError

#: The header naming a debounced call's key (the task's name, ``:`` and the key).
DEBOUNCE = "debounce"
#: Seconds a key's latest record is kept beyond the window: a worker that fetches a message
#: that much later than it was due still tells the latest from the superseded.
LATEST_MARGIN = 3600.0


#: What the broker keeps as the latest call of a key, ``latest_value(id, created)``: its message
#: id and when it was made (``Message.created``), as text. A call is superseded only by a record
#: of another call made no earlier than itself (``superseded_by``). A method of ``str`` (no
#: Python frame): ``map`` makes a batch's values in C.
latest_value: Callable[[str, float], str] = "{}@{!r}".format


def own_prefixes(ids: Sequence[str]) -> str:
    """What the records of the calls ``ids`` begin with (``latest_value``: the id and ``@``),
    one a line, made in C (no Python frame per id), to be split into a list. An id with a line
    break in it (hurtle's never have one) makes that list longer than ``ids``: no match, and
    the caller's slow path decides."""
    return "@\n".join(ids) + "@"


def other_records(found: Sequence[str | None], ids: Sequence[str]) -> dict[int, str]:
    """Of the latest records ``found`` of the keys of the calls ``ids``, by index, those that
    are not the calls' own: another call's, for ``superseded_by`` to judge. A batch whose
    records are all its calls' own, the usual one, is told by one ``startswith`` per call run
    in C; a key with no record (or an id as above) takes a loop over them all."""
    prefixes = own_prefixes(ids).split("\n")
    if len(prefixes) == len(found):
        try:
            if all(map(str.startswith, found, prefixes)):  # type: ignore[arg-type]
                return {}
        except TypeError:  # a key with no record: None
            pass
    return {
        i: value
        for i, (value, id) in enumerate(zip(found, ids, strict=True))
        if value is not None and not value.startswith(id + "@")
    }


def superseded_by(value: str | None, id: str, created: float) -> str | None:
    """The id of the call that replaced the call ``id`` made at ``created``, by the latest
    record of its key (``latest_value``), or None when it was not replaced: no record, its own,
    or one of a call made before it (its publisher's record landed after this call was
    fetched: this call runs, the record's own call was or will be settled by then)."""
    if value is None:
        return None
    by, _, at = value.partition("@")
    if by == id:
        return None
    try:
        made = float(at)
    except ValueError:  # not a record of this version: the id alone decides
        return by
    return by if made >= created else None


def latest_name(queue: str, key: str) -> str:
    """The name under which the broker keeps the latest message id of ``key`` in ``queue``."""
    return f"debounce:{queue}:{key}"


class Debounce(CallKey):
    """A task's checked ``debounce`` option: the window and how a call's key is made."""

    __slots__ = ("seconds", "task")

    def __init__(self, task: str, fn: Callable[..., Any], seconds: object, key: object) -> None:
        self.task = task
        self.seconds = check_debounce(task, seconds)
        super().__init__(task, fn, key, "debounce_key", "user_id")

    @property
    def ttl(self) -> float:
        """Seconds a key's latest record is kept: the window and ``LATEST_MARGIN``."""
        return self.seconds + LATEST_MARGIN

    def key_of(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The debounce key of a call with these arguments: the task's name, then ``:`` and
        the key the option makes of them (none without ``debounce_key``)."""
        if not self.keys_calls:
            return self.task
        return f"{self.task}:{self.text_of(args, kwargs)}"


def check_debounce(task: str, seconds: object) -> float:
    """``debounce=`` as a number of seconds: finite and > 0."""
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 < seconds <= sys.float_info.max  # False for NaN, inf and 10**400
        or not math.isfinite(seconds)
    ):
        raise ConfigurationError(
            f"task {task!r}: debounce must be a finite number of seconds > 0 (of the calls of "
            f"one key sent within that many seconds of each other, only the last runs), got "
            f"{seconds!r:.60}"
        )
    return float(seconds)
