"""Workflows: signatures, and the chains, groups and chords built from them.

``add.s(1, 2)`` is a *signature*: a task with arguments (and ``.options(...)``), not sent yet.

* ``chain(add.s(1, 2), add.s(10), mul.s(3))`` runs one after another, each result becoming the
  next task's first argument; its handle's result is the last task's.
* ``group(add.s(i, i) for i in range(100))`` runs the members in parallel; its handle's result
  is the list of their results, in member order.
* ``chord(group(...), total.s())`` runs the group, then ``total`` with the list of results (in
  member order) as its first argument; its handle's result is ``total``'s.

What makes them hold (``hurtle.worker.flows`` is the worker side):

* Each message carries what it sets off in ``headers["flow"]`` (a ``Flow``, encoded with
  msgspec like the rest of the message; never pickle): a chain link the links still to run, a
  chord member its chord's id, index, size and callback.
* A link's or member's acknowledgement and what it sets off are one atomic step of the broker
  (``Consumer.ack_flow``): the next link is published, or the chord's counter (kept in the
  broker, one entry per member index) counts the member and the member that completes it
  publishes the callback, once. A worker killed at any point neither loses the next step nor
  runs it twice.
* A member that fails for good (retries spent, rejected, dead-lettered by its worker, or by the
  broker's recovery once its workers kept dying) records the failure under the workflow's id at
  once: the handle raises ``TaskFailed`` naming the member, and the callback or next link never
  runs.
* The callback reads its chord's results once, in one broker call, when it starts: no member is
  polled, a chord of 10,000 members costs 10,000 counter updates (batched with the members'
  acknowledgements) and one read.

Messages outside workflows carry no such header and pay nothing for any of this but one check
of their (empty) headers on the processor's inline path.

Not supported (``ConfigurationError`` when built): workflows nested in one another, and tasks
with ``unique_for`` (a link published by a worker takes no unique lock).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from .errors import ConfigurationError, ResultTimeout, TaskFailed
from .handles import Handle, wait_seconds
from .ids import new_id
from .message import Message
from .middleware.results import SUCCEEDED, Record
from .options import same_options
from .task import BoundTask, Task

if TYPE_CHECKING:
    from .app import Hurtle
    from .options import SendOptions

R = TypeVar("R")

#: The header that marks a workflow message.
FLOW = "flow"


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

    def message(self, first: tuple[Any, ...], flow: Flow) -> Message:
        """The message of this link, ``first`` put before its own arguments."""
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


def read_flow(message: Message) -> Flow:
    """The workflow header of ``message`` (``DecodeError``-like ``msgspec.ValidationError`` when
    it is not one)."""
    value = message.headers[FLOW]
    if isinstance(value, Flow):
        return value
    return msgspec.convert(value, Flow)


class Signature(Generic[R]):
    """A task call not sent yet: ``add.s(1, 2)``; ``.options(...)`` returns a copy with those
    options (every option ``Task.options`` takes)."""

    __slots__ = ("args", "kwargs", "opts", "task")

    def __init__(
        self,
        task: Task[Any, R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: SendOptions | None = None,
    ) -> None:
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.opts = opts

    def __repr__(self) -> str:
        return f"<Signature {self.task.name}{self.args!r}>"

    @same_options(Task.options)
    def options(self, **options: Any) -> Signature[R]:
        """A copy with these options (``Task.options`` takes the same ones); an option given
        again replaces the one given before, the others stay."""
        opts = self.task.options(**options).opts
        if self.opts is not None:
            given = {
                f.name: getattr(opts, f.name)
                for f in dataclasses.fields(opts)
                if getattr(opts, f.name) is not None
            }
            opts = dataclasses.replace(self.opts, **given)
        return Signature(self.task, self.args, self.kwargs, opts)

    def send(self) -> Handle[R]:
        """Send this call on its own (no workflow): ``add.s(1, 2).send()``."""
        if self.opts is None:
            return self.task.send(*self.args, **self.kwargs)
        return BoundTask(self.task, self.opts).send(*self.args, **self.kwargs)

    def _check(self, extra: int) -> None:
        """Refuse a call that would not fit once given ``extra`` arguments before its own."""
        task = self.task
        _check_member(task)
        problem = task.unfit((*(None,) * extra, *self.args), self.kwargs)
        if problem is not None:
            what = "" if not extra else " (after the result it is given first)"
            raise ConfigurationError(f"cannot build the workflow: {problem}{what}")

    def _link(self, extra: int) -> Link:
        """This signature as a link whose call gets ``extra`` arguments before its own."""
        task = self.task
        self._check(extra)
        queue, priority, _, headers, expires = task._resolve(self.opts, 0.0)  # relative expiry
        opts = self.opts
        return Link(
            task=task.name,
            queue=queue,
            id=new_id(),
            args=self.args,
            kwargs=self.kwargs,
            priority=priority,
            delay=0.0 if opts is None or opts.delay is None else float(opts.delay),
            eta=0.0 if opts is None or opts.eta is None else float(opts.eta),
            headers=headers,
            expires=expires,
        )


def _check_member(task: Task[Any, Any]) -> None:
    if task.limits is not None and task.limits.unique_for is not None:
        raise ConfigurationError(
            f"task {task.name} has unique_for: it cannot be part of a workflow (a link "
            "published by a worker takes no unique lock); send it on its own"
        )


def _signatures(items: Iterable[Any], what: str) -> list[Signature[Any]]:
    sigs = list(items)
    for s in sigs:
        if not isinstance(s, Signature):
            raise ConfigurationError(
                f"a {what} takes signatures such as add.s(1, 2), got {type(s).__name__}"
                + (" (workflows cannot be nested)" if isinstance(s, chain | group | chord) else "")
            )
    return sigs


def _app_of(sigs: list[Signature[Any]]) -> Hurtle:
    app = sigs[0].task.app
    for s in sigs:
        if s.task.app is not app:
            raise ConfigurationError(
                f"task {s.task.name} belongs to another app: a workflow runs on one broker"
            )
    return app


def _publish(app: Hurtle, messages: list[Message]) -> None:
    for hook in app._publish_hooks:
        messages = hook.before_publish(messages)
    if messages:
        app.broker.publish(messages)


class chain:
    """``chain(add.s(1, 2), add.s(10), mul.s(3))``: each result is the next task's first
    argument; ``.send()`` returns a handle whose result is the last task's."""

    def __init__(self, *signatures: Signature[Any]) -> None:
        self.signatures = _signatures(signatures, "chain")
        if not self.signatures:
            raise ConfigurationError("a chain needs at least one signature")
        for i, s in enumerate(self.signatures):
            s._check(0 if i == 0 else 1)

    def send(self) -> FlowHandle[Any]:
        sigs = self.signatures
        app = _app_of(sigs)
        links = [s._link(0 if i == 0 else 1) for i, s in enumerate(sigs)]
        last = sigs[-1].task
        flow_id = links[-1].id
        first, rest = links[0], tuple(links[1:])
        flow = Flow(id=flow_id, store=0.0 if rest else last.result_ttl, next=rest)
        _publish(app, [first.message((), flow)])
        return FlowHandle(flow_id, app, None, last.name)


class group:
    """``group(add.s(i, i) for i in range(100))``: the members run in parallel; ``.send()``
    returns a ``GroupHandle`` whose result is the list of their results, in member order."""

    def __init__(self, *signatures: Signature[Any] | Iterable[Signature[Any]]) -> None:
        if len(signatures) == 1 and not isinstance(signatures[0], Signature):
            items: Iterable[Any] = signatures[0]
        else:
            items = signatures
        self.signatures = _signatures(items, "group")
        for s in self.signatures:
            s._check(0)

    def send(self) -> GroupHandle:
        sigs = self.signatures
        if not sigs:
            raise ConfigurationError("a group needs at least one signature")
        app = _app_of(sigs)
        messages = []
        for s in sigs:
            link = s._link(0)
            messages.append(link.message((), Flow(id=link.id, store=s.task.result_ttl)))
        _publish(app, messages)
        return GroupHandle([FlowHandle(m.id, app, None, m.task) for m in messages])


class chord:
    """``chord(group(...), total.s())``: ``total`` runs once every member succeeded, with the
    list of their results (in member order) first; ``.send()`` returns its handle. A member
    that fails for good fails the chord at once, and ``total`` never runs."""

    def __init__(self, header: group | Iterable[Signature[Any]], callback: Signature[R]) -> None:
        members = header.signatures if isinstance(header, group) else _signatures(header, "chord")
        self.members = members
        self.callback = _signatures([callback], "chord")[0]
        for s in members:
            s._check(0)
        self.callback._check(1)

    def send(self) -> FlowHandle[Any]:
        members, callback = self.members, self.callback
        app = _app_of([*members, callback])
        ttl = callback.task.result_ttl
        cb = callback._link(1)
        total = len(members)
        if not total:  # nothing to wait for: the callback runs at once, with no results
            _publish(app, [cb.message(([],), Flow(id=cb.id, store=ttl))])
            return FlowHandle(cb.id, app, None, callback.task.name)
        messages = [
            s._link(0).message(
                (), Flow(id=cb.id, chord=cb.id, index=i, total=total, callback=cb, store=0.0)
            )
            for i, s in enumerate(members)
        ]
        _publish(app, messages)
        return FlowHandle(cb.id, app, None, callback.task.name)


class FlowHandle(Handle[R]):
    """The handle of a workflow (or one member): ``result`` is its final result, or raises
    ``TaskFailed`` naming the member that failed for good."""

    name: str = "?"

    def __repr__(self) -> str:
        return f"<FlowHandle {self.name}[{self.id}]>"

    def _unwrap(self, record: Record) -> R:
        if record.state == SUCCEEDED:
            value: R = record.value
            return value
        member, member_id = self.name, self.id
        if isinstance(record.value, list) and len(record.value) == 2:
            member, member_id = str(record.value[0]), str(record.value[1])
        raise TaskFailed(
            member_id, member, record.error_type, record.error_message, record.traceback
        )

    def _timeout(self, timeout: float) -> ResultTimeout:
        return ResultTimeout(
            f"no result for workflow {self.name}[{self.id}] within {timeout:g}s; is a worker "
            "consuming its queues?"
        )


class GroupHandle:
    """The handles of a group's members; ``result(timeout)`` is the list of their results."""

    def __init__(self, handles: list[FlowHandle[Any]]) -> None:
        self.handles = handles

    def __repr__(self) -> str:
        return f"<GroupHandle of {len(self.handles)}>"

    def __len__(self) -> int:
        return len(self.handles)

    @property
    def ids(self) -> list[str]:
        return [h.id for h in self.handles]

    def result(self, timeout: float | None = 10.0) -> list[Any]:
        """The members' results in order, within ``timeout`` seconds in all (``None``: as long
        as it takes); raises ``TaskFailed`` naming a member that failed for good."""
        deadline = time.monotonic() + wait_seconds(timeout)
        return [h.result(max(deadline - time.monotonic(), 0.0)) for h in self.handles]

    async def aresult(self, timeout: float | None = 10.0) -> list[Any]:
        deadline = time.monotonic() + wait_seconds(timeout)
        return [await h.aresult(max(deadline - time.monotonic(), 0.0)) for h in self.handles]


__all__ = [
    "FLOW",
    "Flow",
    "FlowHandle",
    "GroupHandle",
    "Link",
    "Signature",
    "chain",
    "chord",
    "group",
    "read_flow",
]
