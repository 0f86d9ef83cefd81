"""``Handle``: what ``send`` returns — a message id, and the way to its task's result.

``h.id`` is the message id. For a task that keeps results (``store_result=True``, or the app's
``store_results=True``), ``h.result(timeout)`` waits for the outcome and returns the value, or
raises ``TaskFailed`` once the message failed for good; ``await h.aresult(timeout)`` does the same
without blocking the event loop; ``h.state()`` reads the state now. ``Hurtle.handle(id)`` rebuilds
a handle from an id kept elsewhere.

States (``hurtle.middleware.results`` writes the records; ``hurtle.records`` is their format):

* ``pending`` — no record yet: the message waits in its queue or is being run;
* ``running`` — reserved: never reported (see ``hurtle.middleware.results`` for why);
* ``succeeded`` — the task returned; ``result()`` returns the value (opened, for an encrypted
  task: ``SealError`` if this app has not the key that sealed it);
* ``failed`` — an attempt failed and another is scheduled; ``result()`` keeps waiting;
* ``dead`` — failed for good (dead-lettered); ``result()`` raises ``TaskFailed`` at once;
* ``expired`` — not started before its expiry time (``expires=``), so never run;
  ``result()`` raises ``TaskFailed`` at once;
* ``cancelled`` — cancelled before it started (``Hurtle.cancel``), so never run; likewise;
* ``superseded`` — a debounced call that a later call of its key replaced (``hurtle.debounce``),
  so never run; ``result()`` raises ``Superseded`` (a ``TaskFailed``) naming that call.

Waiting costs no polling loop on Redis: the broker's one listener thread wakes the waiters of the
ids each batch of results announces, however many threads wait. The SQLite broker cannot notify
across processes: waiters re-read with short sleeps (2 ms doubling to 50 ms) within the timeout.
The memory broker wakes them directly.

Celery's spellings work on every handle: ``h.get(timeout=10)`` (``result``; without a timeout it
waits as long as it takes, as Celery's does), ``h.ready()``, ``h.successful()``, ``h.failed()``,
and ``h.status`` / ``h.state``: the state read now under Celery's name (``CELERY_STATES``).
``h.state`` is a ``State``: a ``str`` holding Celery's name, so ``h.state == "SUCCESS"`` holds,
that called returns hurtle's (``h.state() == "succeeded"``), so both spellings keep working.

Workflows have handles of their own: ``FlowHandle`` (a chain's or chord's, or one group
member's) and ``GroupHandle`` (a group's members).

A handle is one small object with the id, the app and the task; ``send_many`` makes one per
message and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

import msgspec

from .errors import ConfigurationError, ResultError, ResultTimeout, Superseded, TaskFailed
from .progress import Progress, decode_progress
from .records import (
    CANCELLED,
    DEAD,
    EXPIRED,
    FAILED,
    FINAL,
    PENDING,
    RUNNING,
    SUCCEEDED,
    SUPERSEDED,
    Record,
    decode,
)
from .sealing import is_sealed, no_keys

if TYPE_CHECKING:
    from .app import Hurtle
    from .brokers import Broker
    from .task import Task

R = TypeVar("R")

#: Sleeps between reads on brokers that cannot notify: the first, and the longest.
POLL_FIRST = 0.002
POLL_MAX = 0.05
#: Longest wait between two reads on brokers that notify (in case a notification was lost).
RECHECK = 5.0


#: Celery's name of each of hurtle's states (``Handle.status``). Celery marks an expired message
#: revoked, as it does a cancelled one; hurtle never reports ``running`` (``STARTED``).
CELERY_STATES = {
    PENDING: "PENDING",
    RUNNING: "STARTED",
    SUCCEEDED: "SUCCESS",
    FAILED: "RETRY",
    DEAD: "FAILURE",
    EXPIRED: "REVOKED",
    CANCELLED: "REVOKED",
    SUPERSEDED: "REVOKED",
}


class State(str):
    """A state read from a handle: Celery's name (``h.state == "SUCCESS"``), and called,
    hurtle's (``h.state() == "succeeded"``)."""

    hurtle: str

    def __new__(cls, hurtle: str) -> State:
        state = super().__new__(cls, CELERY_STATES[hurtle])
        state.hurtle = hurtle
        return state

    def __call__(self) -> str:
        """hurtle's name of this state: ``pending``, ``succeeded``, ``failed``, ``dead``,
        ``expired``, ``cancelled`` or ``superseded``."""
        return self.hurtle

    def __getnewargs__(self) -> tuple[str]:
        return (self.hurtle,)


def wait_seconds(timeout: object) -> float:
    """A ``timeout=`` of a wait, checked: ``None`` (wait as long as it takes, as infinity does)
    or a number of seconds >= 0; else a ``ConfigurationError`` naming the value."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, float) and timeout >= 0:  # False for NaN
        return float(timeout)
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout >= 0:
        return float(timeout) if timeout < 2**53 else math.inf  # 10**400: no OverflowError
    raise ConfigurationError(
        f"timeout must be a number of seconds >= 0, or None to wait as long as it takes; "
        f"got {timeout!r:.60}"
    )


class _Seen(msgspec.Struct, kw_only=True, gc=False, eq=False):
    """What a handle learnt from the records it read. Its field is keyword-only, so that the
    positional fields of ``Handle`` and of its subclasses keep their places."""

    #: The task's name from the last record read, for a handle made without its task.
    _task_name: str = ""


class Handle(_Seen, Generic[R], gc=False, eq=False):
    """A sent message: its ``id``, and its task's result if the task keeps results.

    ``app`` sends and reads through its broker; ``task`` is known when ``send`` made the handle
    (``Hurtle.handle`` may not know it). Two handles are equal when their ids are. A msgspec
    ``Struct``: ``send_many`` makes one per message, five times faster than a plain class.
    """

    id: str
    app: Hurtle
    task: Task[Any, R] | None = None

    def __repr__(self) -> str:
        name = self._name()
        return f"<Handle {name}[{self.id}]>" if name else f"<Handle [{self.id}]>"

    def _name(self) -> str:
        """The task's name: its own, else the one the last record read named, else ''."""
        return self.task.name if self.task is not None else self._task_name

    def _read(self, record: Record) -> Record:
        """Remember the task a record names (records of older versions name none)."""
        if record.task:
            self._task_name = record.task
        return record

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def state(self) -> State:
        """The state, read now: ``h.state()`` is hurtle's name (``pending``, ``succeeded``,
        ``failed``, ``dead``, ``expired``, ``cancelled`` or ``superseded``: module docstring),
        and ``h.state`` itself a str holding Celery's (``PENDING``, ``SUCCESS``, ``RETRY``,
        ``FAILURE``, ``REVOKED``)."""
        self._check()
        payload = self.app.broker.get_result(self.id)
        return State(PENDING if payload is None else self._read(decode(payload)).state)

    def progress(self) -> Progress | None:
        """The task's latest progress report, read now (``hurtle.current().progress``): a
        ``Progress`` with ``fraction`` (0 to 1), ``message`` and ``at`` (when it was written),
        or None before the first report (or after ``PROGRESS_TTL``, a day). Reports are
        written by the worker at most every half second, so this lags the task by that much."""
        return decode_progress(self.app.broker.get_progress([self.id])[0])

    @property
    def status(self) -> str:
        """Celery's name of the state, read now: ``h.status == "SUCCESS"``."""
        return str(self.state)

    def ready(self) -> bool:
        """Celery's: whether the message is done with (succeeded, dead, expired or
        cancelled), read now."""
        return self.state() in FINAL

    def successful(self) -> bool:
        """Celery's: whether the task succeeded, read now."""
        return self.state() == SUCCEEDED

    def failed(self) -> bool:
        """Celery's: whether the task failed for good (``dead``: Celery's ``FAILURE``), read
        now."""
        return self.state() == DEAD

    @overload
    def get(self, timeout: float | None = None, propagate: Literal[True] = True) -> R: ...

    @overload
    def get(self, timeout: float | None = None, *, propagate: bool) -> R | TaskFailed: ...

    def get(self, timeout: float | None = None, propagate: bool = True) -> R | TaskFailed:
        """Celery's ``result``: ``h.get(timeout=10)``. Without a timeout it waits as long as
        it takes, as Celery's does; ``propagate=False`` returns the ``TaskFailed`` instead of
        raising it."""
        try:
            return self.result(timeout)
        except TaskFailed as err:
            if propagate:
                raise
            return err

    def result(self, timeout: float | None = 10.0) -> R:
        """The task's return value, waiting up to ``timeout`` seconds for it (``None``: as long
        as it takes).

        Raises ``TaskFailed`` when the message failed for good, ``ResultTimeout`` when nothing
        final arrived in time, ``ResultError`` at once when the task does not keep results,
        ``ConfigurationError`` at once when ``timeout`` is not seconds >= 0 or None.
        """
        timeout = wait_seconds(timeout)
        self._check()
        broker = self.app.broker
        deadline = time.monotonic() + timeout
        event = threading.Event()
        stop = broker.watch_results(self._watched(), event.set)
        delay = POLL_FIRST
        try:
            while True:
                event.clear()
                record = self._final(broker)
                if record is not None:
                    return self._unwrap(record)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout(timeout)
                if stop is None:
                    event.wait(min(left, delay))
                    delay = min(delay * 2, POLL_MAX)
                else:
                    event.wait(min(left, RECHECK))
        finally:
            if stop is not None:
                stop()

    async def aresult(self, timeout: float | None = 10.0) -> R:
        """``result`` for asyncio code: the loop runs while this waits (reads run in the loop's
        default executor, wake-ups come through ``call_soon_threadsafe``)."""
        timeout = wait_seconds(timeout)
        self._check()
        broker = self.app.broker
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        event = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(event.set)

        stop = broker.watch_results(self._watched(), wake)
        delay = POLL_FIRST
        try:
            while True:
                event.clear()
                record = await loop.run_in_executor(None, self._final, broker)
                if record is not None:
                    return self._unwrap(record)
                left = deadline - loop.time()
                if left <= 0:
                    raise self._timeout(timeout)
                wait = min(left, RECHECK)
                if stop is None:
                    wait = min(left, delay)
                    delay = min(delay * 2, POLL_MAX)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), wait)
        finally:
            if stop is not None:
                stop()

    # -- helpers ---------------------------------------------------------------------------

    def _check(self) -> None:
        task = self.task
        if task is not None and not task.store_result:
            raise ResultError(
                f"task {task.name} does not keep results, so {self!r} has none to wait for; "
                f"register it with @app.task(store_result=True) (or create the app with "
                f"Hurtle(store_results=True)) and send it again"
            )

    def _watched(self) -> list[str]:
        """The ids whose records a wait for this one's wakes up on."""
        return [self.id]

    def _final(self, broker: Broker) -> Record | None:
        payload = broker.get_result(self.id)
        if payload is None:
            return None
        record = self._read(decode(payload))
        return record if record.state in FINAL else None

    def _unwrap(self, record: Record) -> R:
        if record.state == SUCCEEDED:
            return self._value(record)
        name = self._name() or "?"
        if record.state == SUPERSEDED:
            raise Superseded(self.id, name, record.error_message, str(record.value))
        raise TaskFailed(self.id, name, record.error_type, record.error_message, record.traceback)

    def _value(self, record: Record) -> R:
        """The value of a ``succeeded`` record, opened if its task sealed it (``SealError``
        when this app has not the key that sealed it)."""
        value = record.value
        if is_sealed(value):
            keyring = self.app.keyring
            task = record.task or self._name()
            if keyring is None:
                raise no_keys(f"result of task {task}[{self.id}]")
            value = keyring.open_value(task, value)
        result: R = value
        return result

    def _timeout(self, timeout: float) -> ResultTimeout:
        try:
            state = self.state()
        except Exception as err:  # the broker went away: say so rather than hide it
            state = f"unknown ({err})"
        name = self._name()  # known once a record was read (state() above reads one)
        what = f"task {name}[{self.id}]" if name else f"message {self.id}"
        return ResultTimeout(
            f"no result for {what} within {timeout:g}s (state: {state}); "
            "is a worker consuming its queue?"
        )


class FlowHandle(Handle[R]):
    """The handle of a workflow (or one member): ``result`` is its final result, or raises
    ``TaskFailed`` naming the member that failed for good."""

    name: str = "?"
    #: The message ids of the workflow's members, in order (a chain's links; a chord's
    #: members, then its callback; every message of a nested workflow or a graph, in the
    #: order they were made), when this handle was made by ``send``.
    members: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<FlowHandle {self.name}[{self.id}]>"

    def members_progress(self) -> list[Progress | None]:
        """The latest progress report of each member (``members``), in order, read in one
        broker call: None for a member that has not reported (or not started)."""
        ids = self.members or (self.id,)
        return [decode_progress(p) for p in self.app.broker.get_progress(list(ids))]

    def _unwrap(self, record: Record) -> R:
        if record.state == SUCCEEDED:
            return self._value(record)
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


class GraphHandle(FlowHandle[dict[str, Any]]):
    """The handle of a graph (``hurtle.graphs``): ``result`` is a dict of the results of the
    nodes nothing waits for, by name; ``node(name)`` is one node's own handle."""

    #: The nodes nothing waits for, whose results are the graph's, in order.
    sinks: tuple[str, ...] = ()
    #: The message id of each node, by name.
    ids: dict[str, str] = {}
    #: The task of each node, by name.
    tasks: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<GraphHandle of {len(self.ids)} nodes [{self.id}]>"

    def node(self, name: str) -> FlowHandle[Any]:
        """The handle of node ``name``: its own result; once the graph has failed, a node
        without a result of its own (it never ran, or had not ended) raises the graph's
        ``TaskFailed`` rather than wait for a result that will not come."""
        node = NodeHandle(self.ids[name], self.app, None, self.tasks[name])
        node.graph = self.id
        return node

    def _value(self, record: Record) -> dict[str, Any]:
        value: Any = super()._value(record)
        if len(self.sinks) == 1:
            return {self.sinks[0]: value}
        return dict(zip(self.sinks, value, strict=True))


class NodeHandle(FlowHandle[Any]):
    """One node of a graph (``GraphHandle.node``): its own record, else the graph's failure."""

    #: The id of the graph's own record (``GraphHandle.id``).
    graph: str = ""

    def _watched(self) -> list[str]:
        return [self.id, self.graph]

    def _final(self, broker: Broker) -> Record | None:
        own = super()._final(broker)
        if own is not None:
            return own
        payload = broker.get_result(self.graph)
        if payload is None:
            return None
        record: Record = decode(payload)
        return record if record.state in FINAL and record.state != SUCCEEDED else None


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

    def progress(self) -> list[Progress | None]:
        """The latest progress report of each member, in order, read in one broker call: None
        for a member that has not reported."""
        if not self.handles:
            return []
        broker = self.handles[0].app.broker
        return [decode_progress(p) for p in broker.get_progress(self.ids)]

    def result(self, timeout: float | None = 10.0) -> list[Any]:
        """The members' results in order, within ``timeout`` seconds in all (``None``: as long
        as it takes); raises ``TaskFailed`` naming a member that failed for good."""
        deadline = time.monotonic() + wait_seconds(timeout)
        return [h.result(max(deadline - time.monotonic(), 0.0)) for h in self.handles]

    async def aresult(self, timeout: float | None = 10.0) -> list[Any]:
        deadline = time.monotonic() + wait_seconds(timeout)
        return [await h.aresult(max(deadline - time.monotonic(), 0.0)) for h in self.handles]

    def get(self, timeout: float | None = None) -> list[Any]:
        """Celery's ``result``: ``g.get(timeout=10)``; without a timeout it waits as long as it
        takes, as Celery's does."""
        return self.result(timeout)

    def ready(self) -> bool:
        """Celery's: whether every member is done with, read now."""
        return all(h.ready() for h in self.handles)

    def successful(self) -> bool:
        """Celery's: whether every member succeeded, read now."""
        return all(h.successful() for h in self.handles)

    def failed(self) -> bool:
        """Celery's: whether some member failed for good, read now."""
        return any(h.failed() for h in self.handles)


__all__ = ["CELERY_STATES", "FlowHandle", "GroupHandle", "Handle", "State", "wait_seconds"]
