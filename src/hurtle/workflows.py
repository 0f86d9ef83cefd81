"""Workflows: signatures, and the chains, groups and chords built from them.

``add.s(1, 2)`` is a *signature*: a task with arguments (and ``.options(...)``), not sent yet.

* ``chain(add.s(1, 2), add.s(10), mul.s(3))`` runs one after another, each result becoming the
  next task's first argument; its handle's result is the last task's.
* ``group(add.s(i, i) for i in range(100))`` runs the members in parallel; its handle's result
  is the list of their results, in member order.
* ``chord(group(...), total.s())`` runs the group, then ``total`` with the list of results (in
  member order) as its first argument; its handle's result is ``total``'s.

What makes them hold (``hurtle.worker.flows`` is the worker side):

* Each message carries what it sets off in ``headers["flow"]`` (a ``Flow``: ``hurtle.flow``,
  encoded with msgspec like the rest of the message; never pickle): a chain link the links
  still to run, a chord member its chord's id, index, size and callback.
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

Celery's spellings build and send the same workflows: ``add.s(1, 2) | mul.s(3)`` is a chain
(and ``group(...) | total.s()`` a chord); ``chain(...)()``, ``.delay()`` and ``.apply_async()``
send one, ``group(...)()`` a group, ``chord([...])(total.s())`` a chord; a signature has
``delay``, ``apply_async`` and ``set`` (Celery's option names), and calling it runs the task
here, as calling a task does. Arguments given when sending are put before a signature's own (a
chain's first step's, each group or chord member's), as Celery does.

Messages outside workflows carry no such header and pay nothing for any of this but one check
of their (empty) headers on the processor's inline path.

Not supported (``ConfigurationError`` when built): workflows nested in one another, and tasks
with ``unique_for`` (a link published by a worker takes no unique lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Never, TypeVar, Unpack

from .errors import ConfigurationError
from .flow import FLOW, Flow, Link, read_flow
from .handles import FlowHandle, GroupHandle, Handle
from .ids import new_id
from .message import Message
from .options import (
    NO_CONNECTION,
    CelerySendOptions,
    SendOptions,
    call_args,
    celery_send,
    same_options,
)
from .sealing import SEALED
from .sending import publish_in

if TYPE_CHECKING:
    from .app import Hurtle
    from .task import Task

R = TypeVar("R")


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

    @same_options(SendOptions.__init__)
    def options(self, **options: Any) -> Signature[R]:
        """A copy with these options (``Task.options`` takes the same ones); an option given
        again replaces the one given before, the others stay."""
        if options.get("connection") is not None:
            raise ConfigurationError(f"signature of {self.task.name!r}: {NO_CONNECTION}")
        opts = self.task.options(**options).opts
        if self.opts is not None:
            given = {
                f.name: getattr(opts, f.name)
                for f in dataclasses.fields(opts)
                if getattr(opts, f.name) is not None
            }
            opts = dataclasses.replace(self.opts, **given)
        return Signature(self.task, self.args, self.kwargs, opts)

    def send(self, *, connection: object = None) -> Handle[R]:
        """Send this call on its own (no workflow): ``add.s(1, 2).send()``; with
        ``connection``, in that connection's transaction (``Task.options``)."""
        if connection is not None:
            opts = self.opts or SendOptions()
            return self.task._bound(opts, connection).send(*self.args, **self.kwargs)
        if self.opts is None:
            return self.task.send(*self.args, **self.kwargs)
        return self.task._bound(self.opts).send(*self.args, **self.kwargs)

    # -- Celery's spellings ----------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Run the task here and now, not sent (Celery's): ``add.s(2)(1)`` is ``add(1, 2)``."""
        sig = self.merged(args, kwargs)
        return sig.task.fn(*sig.args, **sig.kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> Handle[R]:
        """Send this call (Celery's), ``args`` before its own and ``kwargs`` over its own:
        ``add.s(1).delay(2)`` sends ``add(2, 1)``."""
        return self.merged(args, kwargs).send()

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[CelerySendOptions],
    ) -> Handle[R]:
        """Send this call (Celery's), with ``delay``'s arguments and ``Task.apply_async``'s
        options over its own: ``add.s(1, 2).apply_async(countdown=10)``."""
        what = f"signature of {self.task.name!r}: apply_async"
        call, keywords = call_args(what, args, kwargs)
        given = celery_send(what, options)
        connection = given.pop("connection", None)
        sig = self.merged(call, keywords)
        return (sig.options(**given) if given else sig).send(connection=connection)

    def set(self, **options: Unpack[CelerySendOptions]) -> Signature[R]:
        """Set options on this signature itself and return it (Celery's, with its names:
        ``add.s(1, 2).set(countdown=10, queue="slow")``); ``options`` makes a copy instead."""
        given = celery_send(f"signature of {self.task.name!r}: set", options)
        if given:
            self.opts = self.options(**given).opts
        return self

    def __or__(self, other: Signature[Any] | chain) -> chain:
        """``add.s(1, 2) | mul.s(3)``: the chain of the two (Celery's)."""
        return chain(self) | other

    def merged(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Signature[R]:
        """This call with ``args`` before its own and ``kwargs`` over its own (itself if there
        are none): Celery's partial arguments."""
        if not args and not kwargs:
            return self
        return Signature(self.task, (*args, *self.args), {**self.kwargs, **kwargs}, self.opts)

    def _check(self, extra: int, partial: bool = False) -> None:
        """Refuse a call that would not fit once given ``extra`` arguments before its own
        (with ``partial``, at least ``extra``: more may be given when it is sent)."""
        task = self.task
        _check_member(task)
        problem = task.unfit((*(None,) * extra, *self.args), self.kwargs)
        if problem is not None and partial and task.arity is not None:
            more = range(extra + 1, extra + len(task.arity.positional) + 1)
            if any(task.unfit((*(None,) * n, *self.args), self.kwargs) is None for n in more):
                return
        if problem is not None:
            what = "" if not extra else " (after the result it is given first)"
            raise ConfigurationError(f"cannot build the workflow: {problem}{what}")

    def _link(self, extra: int) -> Link:
        """This signature as a link whose call gets ``extra`` arguments before its own."""
        task = self.task
        self._check(extra)
        queue, priority, _, headers, expires = task._resolve(self.opts, 0.0)  # relative expiry
        opts = self.opts
        args, kwargs = self.args, self.kwargs
        if task.fair is not None:  # keyed by its own arguments (not the result put first)
            # a key of arguments it gets later fails here: it takes the queue's own turn
            with contextlib.suppress(TypeError, IndexError, KeyError):
                queue = task.fair.queue_of(queue, args, kwargs)
        if task.keyring is not None:  # sealed as it travels in a header, until it is sent
            args, kwargs = (task.keyring.seal_call(task.name, args, kwargs),), {}
            headers = {**headers, SEALED: task.keyring.id}
        return Link(
            task=task.name,
            queue=queue,
            id=new_id(),
            args=args,
            kwargs=kwargs,
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
    if task.debounce is not None:
        raise ConfigurationError(
            f"task {task.name} is debounced (debounce=): it cannot be part of a workflow (a "
            "superseded call would end it); send it on its own"
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


def _no_options(what: str, options: dict[str, Any]) -> None:
    if options:
        raise ConfigurationError(
            f"{what} takes no options ({', '.join(options)}): set them on its signatures, "
            "such as add.s(1, 2).set(countdown=10)"
        )


def _nested(what: str, other: object) -> ConfigurationError:
    return ConfigurationError(
        f"cannot append a {type(other).__name__} to a {what}: workflows cannot be nested yet; "
        "send it on its own"
    )


def _publish(app: Hurtle, messages: list[Message], connection: object = None) -> None:
    if connection is not None:
        publish_in(app, connection, messages)
        return
    for hook in app._publish_hooks:
        messages = hook.before_publish(messages)
    if messages:
        app.broker.publish(messages)


H = TypeVar("H")


class _Workflow(Generic[H]):
    """What a chain and a group share: Celery's ``delay`` and ``apply_async``, which send the
    workflow with arguments given to it (``_given``: to a chain's first step, to each member
    of a group), or as it is when there are none."""

    def send(self, *, connection: object = None) -> H:
        raise NotImplementedError

    def _given(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Workflow[H]:
        raise NotImplementedError

    def delay(self, *args: Any, **kwargs: Any) -> H:
        """Send it (Celery's), ``args`` and ``kwargs`` given as ``apply_async`` gives them."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        connection: object = None,
        **options: Never,
    ) -> H:
        """Send it (Celery's), ``args`` and ``kwargs`` given to a chain's first step or to each
        member of a group; with ``connection``, as ``send`` does."""
        what = type(self).__name__
        _no_options(f"a {what}", options)
        call, keywords = call_args(f"{what}: apply_async", args, kwargs)
        if not call and not keywords:
            return self.send(connection=connection)
        return self._given(call, keywords).send(connection=connection)


class chain(_Workflow[FlowHandle[Any]]):
    """``chain(add.s(1, 2), add.s(10), mul.s(3))``: each result is the next task's first
    argument; ``.send()`` returns a handle whose result is the last task's."""

    def __init__(self, *signatures: Signature[Any]) -> None:
        self.signatures = _signatures(signatures, "chain")
        if not self.signatures:
            raise ConfigurationError("a chain needs at least one signature")
        for i, s in enumerate(self.signatures):  # the first may get arguments when sent
            s._check(0 if i == 0 else 1, partial=i == 0)

    def send(self, *, connection: object = None) -> FlowHandle[Any]:
        """Send the chain; with ``connection``, in that connection's transaction
        (``Task.options``): the first step runs once it commits, never if it rolls back."""
        sigs = self.signatures
        app = _app_of(sigs)
        links = [s._link(0 if i == 0 else 1) for i, s in enumerate(sigs)]
        last = sigs[-1].task
        flow_id = links[-1].id
        first, rest = links[0], tuple(links[1:])
        flow = Flow(id=flow_id, store=0.0 if rest else last.result_ttl, next=rest)
        _publish(app, [first.message((), flow)], connection)
        return FlowHandle(flow_id, app, None, last.name, tuple(link.id for link in links))

    def __call__(self, *args: Any, **kwargs: Any) -> FlowHandle[Any]:
        """Send the chain (Celery's), ``args`` and ``kwargs`` given to its first step."""
        return self.apply_async(args, kwargs)

    def _given(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> chain:
        """The chain with ``args`` and ``kwargs`` given to its first step."""
        first, *rest = self.signatures
        return chain(first.merged(args, kwargs), *rest)

    def __or__(self, other: Signature[Any] | chain) -> chain:
        """``chain(...) | mul.s(3)``, ``chain(...) | chain(...)``: a longer chain (Celery's)."""
        if isinstance(other, Signature):
            return chain(*self.signatures, other)
        if isinstance(other, chain):
            return chain(*self.signatures, *other.signatures)
        if isinstance(other, group | chord):
            raise _nested("chain", other)
        return NotImplemented


class group(_Workflow[GroupHandle]):
    """``group(add.s(i, i) for i in range(100))``: the members run in parallel; ``.send()``
    returns a ``GroupHandle`` whose result is the list of their results, in member order."""

    def __init__(self, *signatures: Signature[Any] | Iterable[Signature[Any]]) -> None:
        if len(signatures) == 1 and not isinstance(signatures[0], Signature):
            items: Iterable[Any] = signatures[0]
        else:
            items = signatures
        self.signatures = _signatures(items, "group")
        for s in self.signatures:  # each may get arguments when sent
            s._check(0, partial=True)

    def send(self, *, connection: object = None) -> GroupHandle:
        """Send the group; with ``connection``, in that connection's transaction
        (``Task.options``)."""
        sigs = self.signatures
        if not sigs:
            raise ConfigurationError("a group needs at least one signature")
        app = _app_of(sigs)
        messages = []
        for s in sigs:
            link = s._link(0)
            messages.append(link.message((), Flow(id=link.id, store=s.task.result_ttl)))
        _publish(app, messages, connection)
        return GroupHandle([FlowHandle(m.id, app, None, m.task) for m in messages])

    def __call__(self, *args: Any, **options: Never) -> GroupHandle:
        """Send the group (Celery's), ``args`` put before each member's own."""
        return self.apply_async(args, **options)

    def _given(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> group:
        """The group with ``args`` and ``kwargs`` given to each member."""
        return group(s.merged(args, kwargs) for s in self.signatures)

    def __or__(self, other: Signature[Any]) -> chord:
        """``group(...) | total.s()``: the chord of the two (Celery's)."""
        if isinstance(other, Signature):
            return chord(self, other)
        if isinstance(other, chain | group | chord):
            raise _nested("group", other)
        return NotImplemented


class chord:
    """``chord(group(...), total.s())``: ``total`` runs once every member succeeded, with the
    list of their results (in member order) first; ``.send()`` returns its handle. A member
    that fails for good fails the chord at once, and ``total`` never runs.

    As in Celery, the callback may come when it is sent: ``chord([...])(total.s())``."""

    def __init__(
        self, header: group | Iterable[Signature[Any]], callback: Signature[Any] | None = None
    ) -> None:
        members = header.signatures if isinstance(header, group) else _signatures(header, "chord")
        self.members = members
        self.callback = None if callback is None else _signatures([callback], "chord")[0]
        for s in members:
            s._check(0)
        if self.callback is not None:
            self.callback._check(1)

    def __call__(self, callback: Signature[Any] | None = None, **options: Never) -> FlowHandle[Any]:
        """Send the chord (Celery's): ``chord([...])(total.s())`` gives the callback now."""
        _no_options("a chord", options)
        if callback is not None:
            return chord(self.members, callback).send()
        return self.send()

    def delay(self) -> FlowHandle[Any]:
        """Send the chord (Celery's)."""
        return self.send()

    def apply_async(self, *, connection: object = None, **options: Never) -> FlowHandle[Any]:
        """Send the chord (Celery's); with ``connection``, as ``send`` does."""
        _no_options("a chord", options)
        return self.send(connection=connection)

    def send(self, *, connection: object = None) -> FlowHandle[Any]:
        """Send the chord; with ``connection``, its members are written in that connection's
        transaction (``Task.options``)."""
        members, callback = self.members, self.callback
        if callback is None:
            raise ConfigurationError(
                "a chord needs a callback: chord(header, total.s()), or chord(header)(total.s())"
            )
        app = _app_of([*members, callback])
        ttl = callback.task.result_ttl
        cb = callback._link(1)
        total = len(members)
        if not total:  # nothing to wait for: the callback runs at once, with no results
            _publish(app, [cb.message(([],), Flow(id=cb.id, store=ttl), app.keyring)], connection)
            return FlowHandle(cb.id, app, None, callback.task.name)
        messages = [
            s._link(0).message(
                (), Flow(id=cb.id, chord=cb.id, index=i, total=total, callback=cb, store=0.0)
            )
            for i, s in enumerate(members)
        ]
        _publish(app, messages, connection)
        ids = (*(m.id for m in messages), cb.id)
        return FlowHandle(cb.id, app, None, callback.task.name, ids)


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
