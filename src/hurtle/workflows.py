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

Workflows nest: a chain's step may be a group (each member gets the result before it, the step
after gets the list of theirs), a chord or a chain; a group's or chord's member may be a chain,
a group or a chord. How they become messages is told in ``hurtle.nesting``; a graph of
dependencies (``app.graph``) in ``hurtle.graphs``.

Not supported (``ConfigurationError`` when built): tasks with ``unique_for`` (a link published
by a worker takes no unique lock) or ``debounce`` in a workflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Never, TypeAlias, TypeVar

from .errors import ConfigurationError
from .flow import COLLECT, FLOW, Flow, Link, Step, read_flow
from .handles import FlowHandle, GroupHandle
from .message import Message
from .nesting import Build, Rest
from .options import call_args
from .sending import publish_in
from .signature import Signature, check_member

if TYPE_CHECKING:
    from .app import Hurtle

#: A part of a workflow: a signature, or a workflow in a larger one.
Part: TypeAlias = "Signature[Any] | chain | group | chord"


def _parts(items: Iterable[Any], what: str) -> list[Part]:
    parts = list(items)
    for s in parts:
        if not isinstance(s, _PARTS):
            raise ConfigurationError(
                f"a {what} takes signatures such as add.s(1, 2), or chains, groups and chords "
                f"of them; got {type(s).__name__}"
            )
    return parts


def _signatures_of(part: Part) -> list[Signature[Any]]:
    """Every signature in ``part``, at any depth."""
    if isinstance(part, Signature):
        return [part]
    inner = part.parts if isinstance(part, chain) else part.members
    found = [s for p in inner for s in _signatures_of(p)]
    if isinstance(part, chord) and part.callback is not None:
        found += _signatures_of(part.callback)
    return found


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


def publish_workflow(app: Hurtle, messages: list[Message], connection: object = None) -> None:
    if connection is not None:
        publish_in(app, connection, messages)
        return
    for hook in app._publish_hooks:
        messages = hook.before_publish(messages)
    if messages:
        app.broker.publish(messages)


def _send_nested(part: Part, connection: object) -> FlowHandle[Any]:
    """Send a workflow with workflows in it (``hurtle.nesting``): the messages that start it,
    each header saying what its result sets off; the handle waits on the last one."""
    for sig in _signatures_of(part):
        check_member(sig.task)
    build = Build(_app_of(_signatures_of(part)))
    steps = part._steps(0, None, build)
    app = build.app
    publish_workflow(app, [s.link.message((), s.flow, app.keyring) for s in steps], connection)
    return FlowHandle(build.root, app, None, part._last(), tuple(build.ids))


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


def _given_to(part: Part, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Part:
    if isinstance(part, Signature):
        return part.merged(args, kwargs)
    if isinstance(part, chord):
        return chord([_given_to(m, args, kwargs) for m in part.members], part.callback)
    return part._given(args, kwargs)


class chain(_Workflow[FlowHandle[Any]]):
    """``chain(add.s(1, 2), add.s(10), mul.s(3))``: each result is the next step's first
    argument; ``.send()`` returns a handle whose result is the last step's. A step may be a
    group (each member gets the result before it; the step after gets the list of theirs), a
    chord or another chain."""

    def __init__(self, *signatures: Part) -> None:
        parts: list[Part] = []
        for p in _parts(signatures, "chain"):
            parts += p.parts if isinstance(p, chain) else [p]
        if not parts:
            raise ConfigurationError("a chain needs at least one signature")
        self.parts: list[Part] = parts
        #: The chain's signatures, when it is flat (no group or chord in it); else empty.
        self.signatures: list[Signature[Any]] = []
        if all(isinstance(p, Signature) for p in parts):
            self.signatures = [p for p in parts if isinstance(p, Signature)]
        for i, s in enumerate(parts):  # the first may get arguments when sent
            if isinstance(s, Signature):
                s._check(0 if i == 0 else 1, partial=i == 0)

    def send(self, *, connection: object = None) -> FlowHandle[Any]:
        """Send the chain; with ``connection``, in that connection's transaction
        (``Task.options``): the first step runs once it commits, never if it rolls back."""
        sigs = self.signatures
        if not sigs:
            return _send_nested(self, connection)
        app = _app_of(sigs)
        links = [s._link(0 if i == 0 else 1) for i, s in enumerate(sigs)]
        last = sigs[-1].task
        flow_id = links[-1].id
        first, rest = links[0], tuple(links[1:])
        flow = Flow(id=flow_id, store=0.0 if rest else last.result_ttl, next=rest)
        publish_workflow(app, [first.message((), flow)], connection)
        return FlowHandle(flow_id, app, None, last.name, tuple(link.id for link in links))

    def __call__(self, *args: Any, **kwargs: Any) -> FlowHandle[Any]:
        """Send the chain (Celery's), ``args`` and ``kwargs`` given to its first step."""
        return self.apply_async(args, kwargs)

    def _given(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> chain:
        """The chain with ``args`` and ``kwargs`` given to its first step."""
        first, *rest = self.parts
        return chain(_given_to(first, args, kwargs), *rest)

    def __or__(self, other: Part) -> chain:
        """``chain(...) | mul.s(3)``, ``chain(...) | group(...)``: a longer chain (Celery's)."""
        if isinstance(other, _PARTS):
            return chain(self, other)
        return NotImplemented

    def _steps(self, extra: int, rest: Rest, build: Build) -> list[Step]:
        return build.series(self.parts, extra, rest)

    def _first(self) -> Signature[Any]:
        return self.parts[0]._first()

    def _last(self) -> str:
        return self.parts[-1]._last()


class group(_Workflow[GroupHandle]):
    """``group(add.s(i, i) for i in range(100))``: the members run in parallel; ``.send()``
    returns a ``GroupHandle`` whose result is the list of their results, in member order. A
    member may be a chain, a chord or another group (its result: the list of its members')."""

    def __init__(self, *signatures: Part | Iterable[Part]) -> None:
        if len(signatures) == 1 and not isinstance(
            signatures[0], Signature | chain | group | chord
        ):
            items: Iterable[Any] = signatures[0]
        else:
            items = signatures
        self.members = _parts(items, "group")
        #: The group's signatures, when it is flat (no workflow among its members); else empty.
        self.signatures: list[Signature[Any]] = []
        if all(isinstance(m, Signature) for m in self.members):
            self.signatures = [m for m in self.members if isinstance(m, Signature)]
        for s in self.signatures:  # each may get arguments when sent
            s._check(0, partial=True)

    def send(self, *, connection: object = None) -> GroupHandle:
        """Send the group; with ``connection``, in that connection's transaction
        (``Task.options``)."""
        members = self.members
        if not members:
            raise ConfigurationError("a group needs at least one signature")
        app = _app_of([s for m in members for s in _signatures_of(m)])
        messages: list[Message] = []
        handles: list[FlowHandle[Any]] = []
        for m in members:
            if isinstance(m, Signature):
                link = m._link(0)
                messages.append(link.message((), Flow(id=link.id, store=m.task.result_ttl)))
                handles.append(FlowHandle(link.id, app, None, link.task))
                continue
            for sig in _signatures_of(m):
                check_member(sig.task)
            build = Build(app)
            steps = m._steps(0, None, build)
            messages += [s.link.message((), s.flow, app.keyring) for s in steps]
            handles.append(FlowHandle(build.root, app, None, m._last(), tuple(build.ids)))
        publish_workflow(app, messages, connection)
        return GroupHandle(handles)

    def __call__(self, *args: Any, **options: Never) -> GroupHandle:
        """Send the group (Celery's), ``args`` put before each member's own."""
        return self.apply_async(args, **options)

    def _given(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> group:
        """The group with ``args`` and ``kwargs`` given to each member."""
        return group(_given_to(m, args, kwargs) for m in self.members)

    def __or__(self, other: Part) -> chord | chain:
        """``group(...) | total.s()``: the chord of the two (Celery's); ``group(...) |
        chain(...)`` (or a group, a chord): a chain whose first step is the group."""
        if isinstance(other, Signature):
            return chord(self, other)
        if isinstance(other, chain | group | chord):
            return chain(self, other)
        return NotImplemented

    def _steps(self, extra: int, rest: Rest, build: Build) -> list[Step]:
        return build.gather(self.members, extra, rest)

    def _first(self) -> Signature[Any]:
        return self.members[0]._first()

    def _last(self) -> str:
        return COLLECT


class chord:
    """``chord(group(...), total.s())``: ``total`` runs once every member succeeded, with the
    list of their results (in member order) first; ``.send()`` returns its handle. A member
    that fails for good fails the chord at once, and ``total`` never runs. Members may be
    chains, groups or chords; the callback may be a chain.

    As in Celery, the callback may come when it is sent: ``chord([...])(total.s())``."""

    def __init__(
        self, header: group | Iterable[Part], callback: Signature[Any] | chain | None = None
    ) -> None:
        members = header.members if isinstance(header, group) else _parts(header, "chord")
        self.members = members
        self.callback: Signature[Any] | chain | None = None
        if callback is not None:
            (self.callback,) = _parts([callback], "chord callback")  # type: ignore[assignment]
            if not isinstance(self.callback, Signature | chain):
                raise ConfigurationError(
                    f"a chord's callback is a signature or a chain, got {type(callback).__name__}"
                )
        for s in members:  # a chord in a chain gives them the result before it
            if isinstance(s, Signature):
                s._check(0, partial=True)
        if isinstance(self.callback, Signature):
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

    def __or__(self, other: Part) -> chain:
        """``chord(...) | mul.s(2)``: a chain whose first step is the chord."""
        if isinstance(other, _PARTS):
            return chain(self, other)
        return NotImplemented

    def _needed(self) -> Signature[Any] | chain:
        if self.callback is None:
            raise ConfigurationError(
                "a chord needs a callback: chord(header, total.s()), or chord(header)(total.s())"
            )
        return self.callback

    def send(self, *, connection: object = None) -> FlowHandle[Any]:
        """Send the chord; with ``connection``, its members are written in that connection's
        transaction (``Task.options``)."""
        members, callback = self.members, self._needed()
        if not isinstance(callback, Signature) or not all(
            isinstance(m, Signature) for m in members
        ):
            return _send_nested(self, connection)
        sigs = [m for m in members if isinstance(m, Signature)]
        app = _app_of([*sigs, callback])
        ttl = callback.task.result_ttl
        cb = callback._link(1)
        total = len(sigs)
        if not total:  # nothing to wait for: the callback runs at once, with no results
            publish_workflow(
                app, [cb.message(([],), Flow(id=cb.id, store=ttl), app.keyring)], connection
            )
            return FlowHandle(cb.id, app, None, callback.task.name)
        messages = [
            s._link(0).message(
                (), Flow(id=cb.id, chord=cb.id, index=i, total=total, callback=cb, store=0.0)
            )
            for i, s in enumerate(sigs)
        ]
        publish_workflow(app, messages, connection)
        ids = (*(m.id for m in messages), cb.id)
        return FlowHandle(cb.id, app, None, callback.task.name, ids)

    def _steps(self, extra: int, rest: Rest, build: Build) -> list[Step]:
        return build.series([group(self.members), self._needed()], extra, rest)

    def _first(self) -> Signature[Any]:
        return self.members[0]._first()

    def _last(self) -> str:
        return self._needed()._last()


#: What a workflow is made of.
_PARTS = (Signature, chain, group, chord)
Signature._piped = chain

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
