"""A task call not sent yet: ``add.s(1, 2)``, the part every workflow is made of.

A ``Signature`` holds a task, its arguments and its send options; ``_link`` turns it into the
``Link`` a workflow's header carries (``hurtle.flow``), checked against the task's parameters
for the arguments it will get before its own (the result of the step before it). How
signatures make chains, groups, chords and graphs is told in ``hurtle.workflows``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, Unpack

from .errors import ConfigurationError
from .flow import Link, Step
from .handles import Handle
from .ids import new_id
from .options import (
    NO_CONNECTION,
    CelerySendOptions,
    SendOptions,
    call_args,
    celery_send,
    same_options,
)
from .sealing import SEALED

if TYPE_CHECKING:
    from .nesting import Build, Rest
    from .task import Task
    from .workflows import chain
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

    #: How ``|`` chains this signature with what follows (``hurtle.workflows`` sets it: the
    #: workflows sit above signatures).
    _piped: ClassVar[Callable[[Signature[Any], Any], chain] | None] = None

    def __or__(self, other: Any) -> chain:
        """``add.s(1, 2) | mul.s(3)``: the chain of the two (Celery's); piped into a group,
        a chord or a chain, the chain of the two too."""
        assert Signature._piped is not None, "hurtle.workflows sets it when imported"
        return Signature._piped(self, other)

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
        check_member(task)
        problem = task.unfit((*(None,) * extra, *self.args), self.kwargs)
        if problem is not None and partial and task.arity is not None:
            more = range(extra + 1, extra + len(task.arity.positional) + 1)
            if any(task.unfit((*(None,) * n, *self.args), self.kwargs) is None for n in more):
                return
        if problem is not None:
            what = "" if not extra else " (after the result it is given first)"
            raise ConfigurationError(f"cannot build the workflow: {problem}{what}")

    def queue(self) -> str:
        """The queue this call is sent to."""
        return self.task._resolve(self.opts, 0.0)[0]

    def _steps(self, extra: int, rest: Rest, build: Build) -> list[Step]:
        return [build.signature(self, extra, rest)]

    def _first(self) -> Signature[R]:
        return self

    def _last(self) -> str:
        return self.task.name

    def _link(self, extra: int, id: str | None = None) -> Link:
        """This signature as a link whose call gets ``extra`` arguments before its own (its
        message id ``id``, or a new one)."""
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
            id=id or new_id(),
            args=args,
            kwargs=kwargs,
            priority=priority,
            delay=0.0 if opts is None or opts.delay is None else float(opts.delay),
            eta=0.0 if opts is None or opts.eta is None else float(opts.eta),
            headers=headers,
            expires=expires,
        )


def check_member(task: Task[Any, Any]) -> None:
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
