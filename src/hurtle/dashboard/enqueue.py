"""What ``POST /api/queues/{queue}/messages`` enqueues: a request body turned into checked messages.

A request is refused (``BadRequest``, answered 400) for what ``send()`` would refuse, before it
joins the batch it shares a broker call with (``batcher.py``), so a bad request never fails the
others:

* the queue name (``check_queue_name``), the body's shape, its fields and their types;
* the task name: a dashboard made from an app knows its tasks and refuses any other name
  (``unknown task``, naming the registered ones), unless made with ``allow_unknown_tasks=True``
  (``hurtle dashboard --allow-unknown-tasks``): for tasks whose code the dashboard does not
  have, such as those of another language's workers. A dashboard made from a broker knows no
  task: it refuses every enqueue unless that option is given;
* a registered task's arguments, against its signature, and its options (``priority``, ``eta``),
  by the task itself (``Task.message``): the message is the one ``send()`` would build, with the
  task's own priority and expiry unless the request names a priority;
* arguments that cannot be encoded (an int beyond 64 bits, say): the batcher encodes each
  request's messages on their own before they join a batch (``EncodeError``, also a 400).

Names are never shortened or guessed: ``"add"`` is not ``"tasks.add"``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import ArgumentError, ConfigurationError
from ..ids import new_id
from ..message import Message
from ..names import check_queue_name, task_name_problem
from ..options import SendOptions

if TYPE_CHECKING:
    from ..task import Task

#: Most messages one enqueue request may carry.
MAX_ENQUEUE = 10_000
#: Most registered task names an unknown-task answer lists.
NAMES_SHOWN = 20
_FIELDS = frozenset({"task", "args", "kwargs", "priority", "eta"})
#: Queues whose plain ``SendOptions`` are kept made (the common request names no option).
_PLAIN_KEPT = 256


class BadRequest(Exception):
    """A request the API refuses with 400, and why."""


def decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as err:
        raise BadRequest(f"the request body is not JSON: {err}") from None
    except RecursionError:
        raise BadRequest(
            "the request body nests arrays or objects too deeply to decode: flatten it"
        ) from None


class Enqueuer:
    """Turns enqueue request bodies into messages that ``send()`` would have built.

    ``tasks`` are the app's registered tasks by name, or None when the dashboard was made from
    a broker; ``allow_unknown`` lets through names not among them, as they are.
    """

    def __init__(self, tasks: Mapping[str, Task[Any, Any]] | None, allow_unknown: bool) -> None:
        self.tasks = tasks
        self.allow_unknown = allow_unknown
        self._plain: dict[str, SendOptions] = {}  # queue -> its options without any other

    def messages(self, queue: str, doc: Any) -> list[Message]:
        """The checked and encodable messages of ``doc``: ``{"task", "args", "kwargs",
        "priority", "eta"}`` or a list of those. Raises ``BadRequest`` saying what is wrong."""
        try:
            check_queue_name(queue)
        except ConfigurationError as err:
            raise BadRequest(str(err)) from None
        items = doc if isinstance(doc, list) else [doc]
        if not items:
            raise BadRequest("nothing to enqueue: send a message object or a non-empty list")
        if len(items) > MAX_ENQUEUE:
            raise BadRequest(f"at most {MAX_ENQUEUE} messages per request, got {len(items)}")
        plain = self._plain.get(queue)
        if plain is None:
            if len(self._plain) >= _PLAIN_KEPT:  # client-chosen names: keep a bounded few
                self._plain.clear()
            plain = self._plain[queue] = SendOptions(queue=queue)
        now = time.time()
        out = []
        for n, item in enumerate(items):
            try:
                out.append(self._message(queue, item, plain, now))
            except (BadRequest, ArgumentError, ConfigurationError) as err:
                where = f"message {n}" if isinstance(doc, list) else "the message"
                raise BadRequest(f"{where}: {err}") from None
        return out

    def _message(self, queue: str, item: Any, plain: SendOptions, now: float) -> Message:
        if not isinstance(item, dict):
            raise BadRequest('not an object: expected {"task": "name", "args": [...]}')
        unknown = item.keys() - _FIELDS
        if unknown:
            raise BadRequest(
                f"unknown fields {sorted(unknown)}: use task, args, kwargs, priority, eta"
            )
        name, args, kwargs = item.get("task"), item.get("args", []), item.get("kwargs", {})
        if not isinstance(name, str) or not name:
            raise BadRequest('needs "task": the task\'s name, a non-empty string')
        if (problem := task_name_problem(name)) is not None:
            raise BadRequest(problem)
        if not isinstance(args, list):
            raise BadRequest(f'"args" must be a list, got {type(args).__name__}')
        if not isinstance(kwargs, dict):
            raise BadRequest(f'"kwargs" must be an object, got {type(kwargs).__name__}')
        task = self.tasks.get(name) if self.tasks is not None else None
        if task is None:
            if not self.allow_unknown:
                raise BadRequest(self._unknown(name))
            return Message(
                id=new_id(),
                task=name,
                queue=queue,
                args=tuple(args),
                kwargs=kwargs,
                priority=item.get("priority", 0),
                eta=item.get("eta", 0.0),
                created=now,
            )
        priority, eta = item.get("priority"), item.get("eta")
        options = plain
        if priority is not None or eta is not None:
            options = SendOptions(queue=queue, priority=priority, eta=eta)
        return task.message(tuple(args), kwargs, options)  # refuses what send() refuses

    def _unknown(self, name: str) -> str:
        option = (
            "or, to enqueue tasks this dashboard has not the code of, start it with "
            "--allow-unknown-tasks (create_app(..., allow_unknown_tasks=True))"
        )
        if self.tasks is None:
            return (
                f"unknown task {name!r}: this dashboard was made from a broker and knows no "
                f"task; make it from the app (create_app(app)) {option}"
            )
        known = sorted(self.tasks)
        shown = ", ".join(known[:NAMES_SHOWN]) + (
            f" and {len(known) - NAMES_SHOWN} more" if len(known) > NAMES_SHOWN else ""
        )
        return (
            f"unknown task {name!r}: the app registers {shown or 'no task'}; use one of those "
            f"names {option}"
        )
