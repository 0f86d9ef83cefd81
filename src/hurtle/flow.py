"""The workflow header a message carries (``headers["flow"]``): a ``Flow``, naming what the
message sets off — a chain's links still to run (``Link``: a signature as it travels), or its
place in a chord — and where the workflow's failure is recorded.

A value type, like ``Message``, encoded with msgspec like the rest of the message: the brokers
read it to end what a dead member ends, the worker to take the next step, and ``workflows``
builds it. How workflows hold is told in ``hurtle.workflows``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from .message import Message
from .sealing import SEALED, Keyring, no_keys

#: The header that marks a workflow message.
FLOW = "flow"
#: The task every app has that returns what it is given: it gathers a group's results where no
#: task of the user's takes them (``hurtle.nesting``).
COLLECT = "hurtle.collect"


def collect(value: Any) -> Any:
    """``hurtle.collect``: what it is given (a group's results, gathered)."""
    return value


class Link(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A signature as it travels in a header: everything to build its message later."""

    task: str
    queue: str
    id: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    priority: int = 0
    delay: float = 0.0
    eta: float = 0.0
    headers: dict[str, Any] = {}
    #: Seconds from the moment this link is sent (its previous step settled) after which it is
    #: no longer started; 0: never expires.
    expires: float = 0.0

    def message(
        self, first: tuple[Any, ...], flow: Flow, keyring: Keyring | None = None
    ) -> Message:
        """The message of this link, ``first`` put before its own arguments. A link whose
        arguments are sealed (its task is encrypted) opens them with ``keyring`` to put
        ``first`` before them, and seals them again; ``seal`` seals those of any link."""
        if first and self.headers and SEALED in self.headers:
            if keyring is None:
                raise no_keys(f"arguments of task {self.task}")
            return keyring.prepend(self.message((), flow), first)
        now = time.time()
        eta = self.eta or (now + self.delay if self.delay else 0.0)
        return Message(
            id=self.id,
            task=self.task,
            queue=self.queue,
            args=(*first, *self.args),
            kwargs=self.kwargs,
            priority=self.priority,
            eta=eta,
            created=now,
            headers={**self.headers, FLOW: flow},
            expires=now + self.expires if self.expires else 0,
        )


class Flow(msgspec.Struct, array_like=True, frozen=True, gc=False, omit_defaults=True):
    """``headers["flow"]`` of a workflow message.

    ``id``: where the workflow's failure is recorded (its handle's id). ``store``: seconds to
    keep this message's own result under its id (0: none; the last link, a group member, a
    callback). ``next``: a chain's links still to run. ``chord``/``index``/``total``/
    ``callback``: a chord member's place. ``gather``: on a callback, the chord whose results
    come first (``total`` of them); ``forget``: the chord record to drop once it is done.

    Workflows nested in one another (``hurtle.nesting``) say the rest with two more: ``steps``,
    the messages this one's result is sent on to, put first in each (the next step of a chain,
    or every member of a group that follows it), each with its own header; and ``then``, on a
    chord member, the whole header its callback carries (what the callback sets off in turn),
    where a flat chord's callback header is made from the fields above; ``gathers``, on such
    a callback, how many results it gathers (``total`` is then its own place's, when it is a
    member of a chord too).
    """

    id: str
    store: float = 0.0
    next: tuple[Link, ...] = ()
    chord: str = ""
    index: int = 0
    total: int = 0
    callback: Link | None = None
    gather: str = ""
    forget: str = ""
    steps: tuple[Step, ...] = ()
    then: Flow | None = None
    gathers: int = 0


class Step(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A message a result is sent on to, the result put before its own arguments: its link and
    the header it carries."""

    link: Link
    flow: Flow


def read_flow(message: Message) -> Flow:
    """The workflow header of ``message`` (``DecodeError``-like ``msgspec.ValidationError`` when
    it is not one)."""
    value = message.headers[FLOW]
    if isinstance(value, Flow):
        return value
    return msgspec.convert(value, Flow)
