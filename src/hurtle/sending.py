"""Turning checked calls into messages and publishing them to the app's broker, through its
``before_publish`` hooks: one call, a batch (``send_many``), a call of a task the app does not
register (``send_task``), and calls in the application's open transaction.

``Task`` and its bound forms (``hurtle.task``) check a call and build a single message; the
rest of the road to the broker is here. ``Task.send`` and ``send_many`` each call one function
of this module, no more: a bare call's cost is counted (``tests/test_instruction_budget.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .brokers.base import Broker
from .debounce import DEBOUNCE, LATEST_MARGIN, latest_value
from .errors import ConfigurationError
from .handles import Handle
from .ids import new_id
from .message import CheckedBatch, Message
from .options import SendOptions, call_args, celery_send, check_priority
from .sealing import SEALED

if TYPE_CHECKING:
    from .app import Hurtle
    from .brokers import Broker
    from .task import Task

R = TypeVar("R")


class Args:
    """Positional and keyword arguments of one call, for ``send_many``: ``Args(1, y=2)``."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


def send_by_name(
    app: Hurtle,
    name: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> Handle[Any]:
    """Send a call of the task ``name``, which ``app`` does not register (``send_task``): to
    ``queue=`` or the app's default queue, priority 0 and no expiry unless given; the arguments
    cannot be checked against a signature here, the options are checked as ``send``'s."""
    what = f"send_task({name!r})"
    call, keywords = call_args(what, args, kwargs)
    given = celery_send(what, options)
    connection = given.pop("connection", None)
    try:
        opts = SendOptions(**given)
    except ConfigurationError as err:
        raise ConfigurationError(f"{what}: {err}") from None
    now = time.time()
    queue, priority, eta, headers, expires = opts.resolve(now, app.settings.default_queue, 0, None)
    message = Message(
        new_id(), name, queue, call, keywords, 0, priority, eta, now, headers, expires
    )
    if app.settings.encrypt and app.keyring is not None:  # the app's default for its tasks
        message = app.keyring.seal_message(message)
    if connection is not None:
        return Handle(publish_in(app, connection, [message])[0], app)
    return Handle(publish(app, [message]), app)


def _always(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    return True


def send_batch(
    task: Task[Any, R],
    calls: Iterable[tuple[Any, ...] | list[Any] | dict[str, Any] | Args],
    options: SendOptions | None,
    connection: object = None,
) -> list[Handle[R]]:
    """Enqueue many calls of ``task`` in one batch with ``options`` (``Task.send_many``), with
    ``connection`` in its transaction if given; their handles, in order."""
    now = time.time()
    queue, priority, eta, headers, expires = task._resolve(options, now)
    name = task.name
    check_priority(name, priority)  # once a batch, in case task.priority was reassigned
    empty: dict[str, Any] = {}
    # valid by construction: options are checked when made, the priority just above, attempt
    # is 0 and created is now; so the broker skips its pass over the batch (see CheckedBatch)
    messages = CheckedBatch()
    append = messages.append
    arity = task.arity
    if arity is None:  # no signature to check against
        lo, hi, fits = 0, sys.maxsize, _always
    else:
        lo, hi, fits = arity.bare_min, arity.bare_max, arity.fits
    # Positional calls are checked by their count; a call with keywords is checked when its
    # shape (positional count, keyword names) differs from the previous call's.
    shape_n, shape_names = -1, frozenset[str]()
    limits = task.limits
    unique = limits.unique_key_of if limits is not None and limits.unique_for else None
    # each lock ends at the latest unique_for after the call was made (``publish_unique``)
    until = now + float(limits.unique_for) if limits is not None and limits.unique_for else 0.0
    debounce = task.debounce
    if debounce is not None:  # each call names its key, and waits out the window
        eta = max(eta, now + debounce_seconds(task, options))
    fair = task.fair
    plain = unique is None and debounce is None and fair is None
    keyring = task.keyring
    # an encrypted task's calls are sealed as their messages are built, after their locks and
    # keys are named from them; one headers dict for the batch says they are
    seal = None if keyring is None else keyring.sealer(name)
    if keyring is not None:
        headers = {**headers, SEALED: keyring.id}
    for call in calls:
        if type(call) is tuple:
            args, kwargs = call, empty
        elif isinstance(call, tuple | list):
            args, kwargs = tuple(call), empty
        elif isinstance(call, dict):
            args, kwargs = (), call
        elif isinstance(call, Args):
            args, kwargs = call.args, call.kwargs
        else:
            raise TypeError(
                f"send_many({name}): each call must be a tuple of arguments, a dict of "
                f"keyword arguments or hurtle.Args(...), got {type(call).__name__}"
            )
        if kwargs:
            if len(args) != shape_n or kwargs.keys() != shape_names:
                if not fits(args, kwargs):
                    task._unfit(args, kwargs)
                shape_n, shape_names = len(args), frozenset(kwargs)
        elif not lo <= len(args) <= hi:
            task._unfit(args, kwargs)
        if plain:
            if seal is not None:
                args, kwargs = (seal(args, kwargs),), empty
            append(
                Message(
                    new_id(), name, queue, args, kwargs, 0, priority, eta, now, headers, expires
                )
            )
        else:  # each names its lock, its debounce key, or its fair key's sub-queue
            append(
                Message(
                    new_id(),
                    name,
                    queue if fair is None else fair.queue_of(queue, args, kwargs),
                    args if seal is None else (seal(args, kwargs),),
                    kwargs if seal is None else empty,
                    0,
                    priority,
                    eta,
                    now,
                    headers
                    if debounce is None
                    else {**headers, DEBOUNCE: debounce.key_of(args, kwargs)},
                    expires,
                    "" if unique is None else unique(args, kwargs),
                    until,
                )
            )
    app = task.app
    if messages and connection is not None:
        ids = publish_with(task, messages, connection)
        return [Handle(id_, app, task) for id_ in ids]
    if messages:
        hooks = app._publish_hooks
        published: list[Message] = messages
        if hooks:
            published = list(messages)  # hooks may change it: checked again
            for m in hooks:
                published = m.before_publish(published)
        if debounce is not None:
            unique_for = None if limits is None else limits.unique_for
            ids = publish_latest(app.broker, published, unique_for)
            return [Handle(id_, app, task) for id_ in ids]
        if unique is not None:
            assert task.limits is not None and task.limits.unique_for is not None
            ids = app.broker.publish_unique(published, task.limits.unique_for)
            return [Handle(id_, app, task) for id_ in ids]
        app.broker.publish(published)
        return [Handle(m.id, app, task) for m in published]
    return []


def debounce_seconds(task: Task[Any, Any], options: SendOptions | None) -> float:
    """The window of a call of the debounced ``task`` with ``options``."""
    assert task.debounce is not None
    if options is None or options.debounce is None:
        return task.debounce.seconds
    return float(options.debounce)


def publish_debounced(task: Task[Any, Any], messages: list[Message]) -> list[str]:
    """Publish calls of a debounced task through the app's ``before_publish`` hooks, then
    record each as the latest of its key (``publish_latest``); per published call, the id it
    answers to."""
    sent: list[Message] = CheckedBatch(messages)
    hooks = task.app._publish_hooks
    if hooks:
        sent = list(sent)  # hooks may change it: checked again
        for hook in hooks:
            sent = hook.before_publish(sent)
        if not sent:
            return [m.id for m in messages]
    limits = task.limits
    return publish_latest(task.app.broker, sent, None if limits is None else limits.unique_for)


def publish_latest(broker: Broker, messages: list[Message], unique_for: float | None) -> list[str]:
    """Publish debounced calls (with their unique locks when ``unique_for``), then record,
    in one broker call, each enqueued call that names a key (``DEBOUNCE``) as the latest of
    that key in its queue: the last of a key in the batch wins, as a later publish wins over
    an earlier one. Per call, the id it answers to (``publish_unique``'s, else its own).

    The record comes after the publish: a send that fails in between leaves its call
    enqueued, and the key's older calls run, none lost."""
    if unique_for is not None:
        ids = broker.publish_unique(messages, unique_for)
    else:
        broker.publish(messages)
        ids = [m.id for m in messages]
    latest: list[tuple[str, str, str]] = []
    window = 0.0
    for m, id_ in zip(messages, ids, strict=True):
        key = m.headers.get(DEBOUNCE) if m.headers else None
        if isinstance(key, str) and id_ == m.id:  # enqueued (a unique call may not be)
            latest.append((m.queue, key, latest_value(m.id, m.created)))
            window = max(window, m.eta - m.created)
    if latest:  # in order, repeats too: the broker sees a call replaced within the batch
        broker.put_latest(latest, window + LATEST_MARGIN)
    return ids


def publish_with(task: Task[Any, Any], messages: list[Message], connection: object) -> list[str]:
    """Publish calls of ``task`` with ``connection``, in its transaction (``publish_in``),
    taking their unique locks there if the task has ``unique_for``."""
    limits = task.limits
    unique_for = None if limits is None else limits.unique_for
    return publish_in(task.app, connection, messages, unique_for)


def publish_unique(task: Task[Any, Any], messages: list[Message]) -> list[str]:
    """Publish calls of a ``unique_for`` task, each naming its lock in ``Message.unique``
    and when the lock ends at the latest in ``Message.unique_until`` (its ``created`` plus
    ``unique_for``: ``Task.message`` names them), through the app's ``before_publish`` hooks;
    returns per published call the id of the message that holds its lock (its own when
    enqueued)."""
    limits = task.limits
    assert limits is not None and limits.unique_for is not None
    locked: list[Message] = CheckedBatch(messages)
    hooks = task.app._publish_hooks
    if hooks:
        locked = list(locked)  # hooks may change it: checked again
        for hook in hooks:
            locked = hook.before_publish(locked)
        if not locked:
            return [m.id for m in messages]
    return task.app.broker.publish_unique(locked, limits.unique_for)


def publish(app: Hurtle, messages: list[Message]) -> str:
    """Publish one call's message through the app's ``before_publish`` hooks if any; its id."""
    sent = messages[0].id
    for m in app._publish_hooks:
        messages = m.before_publish(messages)
    if messages:
        app.broker.publish(messages)
        return messages[0].id
    return sent


def publish_in(
    app: Hurtle, connection: object, messages: list[Message], unique_for: float | None = None
) -> list[str]:
    """Publish messages with the application's ``connection``, in its open transaction
    (``Broker.publish_in``), through the app's ``before_publish`` hooks if any; per message
    sent, the id it answers to (the holder of its unique lock with ``unique_for``). With an
    outbox (``outbox=``) they are written to its table instead (``brokers.postgres.outbox``),
    which a task with ``unique_for`` refuses."""
    outbox = app.outbox
    broker = app._broker
    if broker is not None and type(broker).publish_in is not Broker.publish_in:
        outbox = None  # a broker that takes them itself (eager mode's runs them at the send)
    if outbox is not None and unique_for is not None:
        from .brokers.postgres.outbox import unique_refused

        raise ConfigurationError(unique_refused(outbox.url))
    sent = messages
    for m in app._publish_hooks:
        messages = m.before_publish(messages)
    if not messages:
        return [m.id for m in sent]
    if outbox is not None:  # in the caller's database; a relay publishes them once committed
        return outbox.write(connection, messages)
    return app.broker.publish_in(connection, messages, unique_for)
