"""How a workflow of workflows becomes messages: each message's header (``Flow``) says, before
anything is sent, what its result sets off.

A workflow is built from its end backwards. What follows a part (``Rest``) is one of:

* ``Then``: its result is sent on to each of these steps, put first in their arguments (the
  next step of a chain, or every member of a group that comes next);
* ``Join``: its result is one member of a chord, counted by the broker with its
  acknowledgement; the member that completes the count sends the chord's callback;
* ``None``: its result is the whole workflow's, kept under the workflow's id (the id of its
  last message, the one its handle waits on).

A group followed by something is a chord: its callback is the one step that follows, given
the list of the members' results; a group followed by several steps (another group), or by
nothing, gathers its results with ``hurtle.collect``, a task every app has, which returns the
list it is given. Every message of a workflow names the workflow's id, so that any member that
fails for good fails the whole at once, whatever depth it runs at (``hurtle.workflows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec

from .errors import ConfigurationError
from .flow import COLLECT, Flow, Link, Step
from .ids import new_id

if TYPE_CHECKING:
    from .app import Hurtle
    from .workflows import Signature


class Then(NamedTuple):
    """The result is sent on to each of ``steps``, put before its own arguments."""

    steps: tuple[Step, ...]


class Join(NamedTuple):
    """The result is member ``place`` of chord ``chord``, of ``total``; the member that
    completes it sends ``callback`` with the header ``then``."""

    chord: str
    place: int
    total: int
    callback: Link
    then: Flow


#: What follows a part of a workflow; None: nothing, its result is the whole's.
Rest = Then | Join | None


class Part(Protocol):
    """A signature or a workflow, as a part of a larger one."""

    def _steps(self, extra: int, rest: Rest, build: Build) -> list[Step]:
        """The messages that start this part, each to be given ``extra`` arguments first (the
        result before it, if any), whose results go on to ``rest``."""
        ...

    def _first(self) -> Signature[Any]:
        """The signature this part starts with (a group's: its first member's)."""
        ...

    def _last(self) -> str:
        """The name of the task whose result is this part's (``hurtle.collect`` for a group)."""
        ...


class Build:
    """One workflow being built: its app, its id (``root``) and the ids of its messages."""

    def __init__(self, app: Hurtle, root: str | None = None) -> None:
        self.app = app
        self.root = root or new_id()
        #: Every message id of the workflow, in the order they were made.
        self.ids: list[str] = []

    def header(self, rest: Rest, store: float = 0.0) -> Flow:
        """The header of a message whose result goes on to ``rest``, kept ``store`` seconds."""
        if rest is None:
            return Flow(id=self.root, store=store)
        if isinstance(rest, Then):
            return Flow(id=self.root, store=store, steps=rest.steps)
        return Flow(
            id=self.root,
            store=store,
            chord=rest.chord,
            index=rest.place,
            total=rest.total,
            callback=rest.callback,
            then=rest.then,
        )

    def signature(self, sig: Signature[Any], extra: int, rest: Rest) -> Step:
        """The message of ``sig``; it is the workflow's last (its id the workflow's, its result
        kept) when nothing follows it."""
        link = sig._link(extra, self.root if rest is None else None)
        self.ids.append(link.id)
        return Step(link, self.header(rest, sig.task.result_ttl if rest is None else 0.0))

    def collect(self, queue: str, rest: Rest) -> Link:
        """A ``hurtle.collect`` message on ``queue``: it returns what it is given first."""
        self.app.builtin(COLLECT)
        link = Link(task=COLLECT, queue=queue, id=self.root if rest is None else new_id())
        self.ids.append(link.id)
        return link

    def gather(self, members: Sequence[Part], extra: int, rest: Rest) -> list[Step]:
        """The steps that start a group of ``members`` whose results, as a list in member
        order, go on to ``rest``: a chord whose callback is the step that follows, or a
        ``hurtle.collect`` when nothing or more than one step follows."""
        total = len(members)
        if not total:
            raise ConfigurationError("a group needs at least one signature")
        if isinstance(rest, Then) and len(rest.steps) == 1:
            (step,) = rest.steps
            callback = step.link
            then = msgspec.structs.replace(step.flow, gather=callback.id, gathers=total)
        else:
            callback = self.collect(members[0]._first().queue(), rest)
            store = self.app.settings.result_ttl if rest is None else 0.0
            then = msgspec.structs.replace(
                self.header(rest, store), gather=callback.id, gathers=total
            )
        steps: list[Step] = []
        for i, member in enumerate(members):
            joined = Join(callback.id, i, total, callback, then)
            steps += member._steps(extra, joined, self)
        return steps

    def series(self, parts: Sequence[Part], extra: int, rest: Rest) -> list[Step]:
        """The steps that start a chain of ``parts``: each part's results go on to the next,
        the last one's to ``rest``; the first is given ``extra`` arguments first."""
        for i in range(len(parts) - 1, -1, -1):
            steps = parts[i]._steps(extra if i == 0 else 1, rest, self)
            rest = Then(tuple(steps))
        return steps
