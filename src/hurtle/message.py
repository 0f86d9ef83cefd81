"""The wire record of one task call: frozen, encoded once, and knowing nothing about brokers.

Messages are MessagePack arrays (msgspec), so a message can only ever name a registered task and
carry plain data: nothing that comes over the wire is unpickled.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from .errors import DecodeError, EncodeError

#: Priorities run from 0 (the default, lowest) to 9 (highest).
MIN_PRIORITY = 0
MAX_PRIORITY = 9


class Message(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One call of one task.

    ``eta`` is a Unix time before which the message must not run (0 means now); ``attempt`` counts
    earlier attempts, so the first run sees 0.
    """

    id: str
    task: str
    queue: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    attempt: int = 0
    priority: int = 0
    eta: float = 0.0
    created: float = 0.0
    headers: dict[str, Any] = {}

    def encode(self) -> bytes:
        """The MessagePack bytes of this message; raises ``EncodeError`` naming the bad type."""
        try:
            return _encoder.encode(self)
        except (TypeError, ValueError, OverflowError) as err:
            raise EncodeError(
                f"cannot encode the arguments of task {self.task!r}: {err}; pass plain data "
                "(str, int, float, bool, None, bytes, list, tuple, dict, datetime, uuid, "
                "dataclasses) or encode the object yourself"
            ) from err

    @staticmethod
    def decode(raw: bytes) -> Message:
        """Rebuild a message from broker bytes; raises ``DecodeError`` when they are not one."""
        try:
            return _decoder.decode(raw)
        except (msgspec.DecodeError, TypeError, ValueError) as err:
            raise DecodeError(f"not a hurtle message ({len(raw)} bytes): {err}") from err

    @property
    def is_delayed(self) -> bool:
        return self.eta > time.time()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)

#: Decode without wrapping errors, for hot loops that fall back to ``Message.decode`` (and its
#: clear ``DecodeError``) on any exception.
decode_unchecked = _decoder.decode


def encode_many(messages: list[Message]) -> list[bytes]:
    """Encode a batch; the first message that fails raises ``EncodeError`` and nothing is kept."""
    encode = _encoder.encode
    try:
        return [encode(m) for m in messages]
    except (TypeError, ValueError, OverflowError):
        for m in messages:
            m.encode()  # raises the EncodeError naming the task and the type
        raise
