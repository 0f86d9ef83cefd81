"""How hurtle's names map to JetStream's: streams, subjects, consumers and KV keys.

A queue ``q`` is the work-queue stream ``HQ_<q>`` with the subjects ``hq.<q>.<level>``: ``0`` to
``9`` (priorities, one durable pull consumer ``p<level>`` each), ``x`` (quarantine: messages
recovered twice, let out one at a time by a consumer with ``MaxAckPending`` 1) and ``d``
(delayed: held by the promoters of ``delays.py`` until their eta). Its dead letters are the
stream ``HD_<q>`` (subjects ``hd.<q>.<id>``, and ``hd.<q>`` for those written before ids);
``hw.<q>`` is a plain subject that wakes waiting fetches.

Names go into tokens as they are when made of ``[A-Za-z0-9-]``, else as ``_`` and their UTF-8
bytes in hex: the mapping is one to one, and the stream's description keeps the queue's name.
"""

from __future__ import annotations

import re

from ...message import MAX_PRIORITY

_SAFE = re.compile(r"[A-Za-z0-9-]+")

#: Pull levels of a queue in the order a fetch serves them: quarantine, then priorities 9 to 0.
LEVELS = ("x", *(str(p) for p in range(MAX_PRIORITY, -1, -1)))
QUARANTINE = "x"
DELAYED = "d"

#: Headers hurtle sets on stored messages (the payload is the message's bytes, unchanged).
DEATHS = "Hurtle-Deaths"  # how many workers died holding it
ETA = "Hurtle-Eta"  # when a delayed message is due (Unix seconds)
PRIORITY = "Hurtle-Priority"  # its priority level, on delayed and quarantined messages
REASON = "Hurtle-Reason"  # why a dead letter died, its lines flattened (older dead letters)
REASON_JSON = "Hurtle-Reason-Json"  # why a dead letter died, JSON-encoded: lines kept
FAILED_AT = "Hurtle-Failed-At"  # when (Unix seconds)
MSG_ID = "Nats-Msg-Id"  # JetStream's publish deduplication


def token(name: str) -> str:
    """``name`` as one subject token, stream-name part or KV key part."""
    if _SAFE.fullmatch(name):
        return name
    return "_" + name.encode().hex()


def untoken(tok: str) -> str:
    if tok.startswith("_"):
        return bytes.fromhex(tok[1:]).decode()
    return tok


def stream(queue: str) -> str:
    return "HQ_" + token(queue)


def subject(queue: str, level: str) -> str:
    return f"hq.{token(queue)}.{level}"


def durable(level: str) -> str:
    return level if level in (QUARANTINE, DELAYED) else "p" + level


def dead_stream(queue: str) -> str:
    return "HD_" + token(queue)


def dead_subject(queue: str) -> str:
    return f"hd.{token(queue)}"


def wake_subject(queue: str) -> str:
    return f"hw.{token(queue)}"


def parse_reply(reply: str) -> tuple[str, str, int, int]:
    """``(stream, consumer, delivered, stream sequence)`` of a JetStream ack subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>`` (nine tokens), or
    the newer form with a domain and an account hash after ``$JS.ACK`` (twelve).
    """
    parts = reply.split(".")
    if len(parts) == 9:
        return parts[2], parts[3], int(parts[4]), int(parts[5])
    return parts[4], parts[5], int(parts[6]), int(parts[7])
