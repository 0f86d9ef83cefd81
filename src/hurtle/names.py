"""What a queue name and a task name may be: the one check every entry point calls.

A queue name is 1 to ``MAX_QUEUE_NAME`` (100) characters of ``A-Z a-z 0-9 . _ : -``. Each broker
can carry such a name as it is: Redis (and Redis Cluster) put it in a hash tag ``{queue}``, which
a ``{`` or ``}`` would break; NATS makes subject tokens and stream names of it, where a space,
``*`` or ``>`` mean something else. So a name is checked where it comes in (``@app.task(queue=)``,
``.options(queue=)``, ``Hurtle(default_queue=)``, a worker's queues, ``hurtle queue``, the HTTP
API), never per message.

A sharded queue (``brokers/sharded.py``) is stored as several queues named ``q~N``: ``~``
(``SHARD_MARK``) is outside the alphabet of a user's queue name, so none of them can be a
user's queue; brokers take such names too (``stored_queue_name_problem``, what
``Broker.pause``/``resume``/``purge`` check). A fair queue (``hurtle.fair``) stores each key's
calls in a sub-queue ``q~f<16 hex digits>`` (``fair_queue``, ``FAIR_MARK``), a hash of the key:
whatever the key, the name is one every broker takes, and never a shard's or a user's.

A task name is a non-empty str of at most ``MAX_TASK_NAME`` (200) characters: it travels in
every message and names the task in logs, metrics and the dashboard.
"""

from __future__ import annotations

import functools
import hashlib
import re

from .errors import ConfigurationError

#: Longest queue name, in characters.
MAX_QUEUE_NAME = 100
#: Longest task name, in characters.
MAX_TASK_NAME = 200

QUEUE_ALPHABET = "A-Z a-z 0-9 . _ : -"
#: The rule, as error messages state it.
QUEUE_NAME_RULE = (
    f"queue names are 1 to {MAX_QUEUE_NAME} characters of {QUEUE_ALPHABET} "
    "(e.g. 'emails' or 'reports.daily')"
)
_QUEUE_NAME = re.compile(r"[A-Za-z0-9._:-]+")
#: What separates a sharded queue's name from its shard's number in the queues that store it.
SHARD_MARK = "~"
_SHARD_NUMBER = re.compile(r"[0-9]{1,6}")
#: What separates a fair queue's name from the hash of a key in the sub-queue of that key.
FAIR_MARK = SHARD_MARK + "f"
_FAIR_HASH = re.compile(r"f[0-9a-f]{16}")


def queue_name_problem(queue: object) -> str | None:
    """What is wrong with ``queue`` as a queue name, or None."""
    problem = _length_problem("queue name", queue, MAX_QUEUE_NAME)
    if problem is not None or not isinstance(queue, str):
        return problem
    if not _QUEUE_NAME.fullmatch(queue):
        bad = sorted({c for c in queue if not _QUEUE_NAME.fullmatch(c)})
        return f"queue name {_shown(queue)} has characters not allowed: {' '.join(map(repr, bad))}"
    return None


def stored_queue_name_problem(queue: object) -> str | None:
    """What is wrong with ``queue`` as the name of a queue a broker stores, or None: a queue
    name, a shard's (``q~N``: a queue name, ``SHARD_MARK`` and a number) or a fair queue's
    key's (``q~f<hash>``, ``fair_queue``)."""
    if isinstance(queue, str) and SHARD_MARK in queue:
        logical, _, number = queue.rpartition(SHARD_MARK)
        if _SHARD_NUMBER.fullmatch(number) or _FAIR_HASH.fullmatch(number):
            return queue_name_problem(logical)
    return queue_name_problem(queue)


def check_stored_queue_name(queue: object) -> str:
    """``queue``, checked as ``stored_queue_name_problem`` does; else a ``ConfigurationError``."""
    problem = stored_queue_name_problem(queue)
    if problem is not None:
        raise ConfigurationError(f"{problem}; {QUEUE_NAME_RULE}")
    return queue  # type: ignore[return-value]


@functools.lru_cache(maxsize=4096)
def fair_queue(queue: str, key: str) -> str:
    """The sub-queue that stores the calls of fair key ``key`` (as text) in ``queue``:
    ``queue``, ``FAIR_MARK`` and 16 hex digits of a BLAKE2b hash of the key. A pure function:
    every process names a key's sub-queue alike."""
    digest = hashlib.blake2b(key.encode(errors="surrogatepass"), digest_size=8).hexdigest()
    return f"{queue}{FAIR_MARK}{digest}"


def fair_parent(name: str) -> str | None:
    """The queue whose fair key's sub-queue ``name`` is (``fair_queue``), or None when ``name``
    is no key's sub-queue (a user's queue, or a shard's)."""
    queue, mark, digest = name.rpartition(FAIR_MARK)
    if not mark or not _FAIR_HASH.fullmatch("f" + digest):
        return None
    return queue if queue_name_problem(queue) is None else None


def check_queue_name(queue: object) -> str:
    """``queue``, checked: 1 to 100 characters of ``A-Z a-z 0-9 . _ : -``; else a
    ``ConfigurationError`` naming the value."""
    problem = queue_name_problem(queue)
    if problem is not None:
        raise ConfigurationError(f"{problem}; {QUEUE_NAME_RULE}")
    return queue  # type: ignore[return-value]


def task_name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a task name, or None."""
    return _length_problem("task name", name, MAX_TASK_NAME, "; give a shorter name=...")


def check_task_name(name: object) -> str:
    """``name``, checked: a non-empty str of at most 200 characters."""
    problem = task_name_problem(name)
    if problem is not None:
        raise ConfigurationError(problem)
    return name  # type: ignore[return-value]


def _length_problem(kind: str, value: object, longest: int, hint: str = "") -> str | None:
    """What is wrong with ``value`` as a ``kind`` (a str of 1 to ``longest`` characters), or None;
    ``hint`` ends the message of one too long."""
    if not isinstance(value, str):
        return f"a {kind} must be a str, got {_shown(value)} ({type(value).__name__})"
    if not value:
        return f"a {kind} must not be empty"
    if len(value) > longest:
        return (
            f"{kind} {_shown(value)} is {len(value)} characters long: at most {longest} are "
            f"allowed{hint}"
        )
    return None


def _shown(value: object) -> str:
    """``repr(value)``, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}..."
