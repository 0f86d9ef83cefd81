"""The frame: how a burst of messages for one channel travels, as one msgpack array.

A frame is ``[publisher, first_seq, [payload, ...]]``: the publisher's id (a string drawn once per
publisher and process), the sequence number of its first payload on this channel, and the
payloads, each one msgpack value. Payloads are encoded once, when ``publish`` is called (so that a
value msgspec cannot encode fails there, in the caller), and a frame is put together from those
bytes without encoding them again. Subscribers decode a frame in one call.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from ..errors import DecodeError, EncodeError

__all__ = ["decode", "encode_value", "pack", "publisher_bytes"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[str, int, list[Any]])
_encode = _encoder.encode


def encode_value(value: Any) -> bytes:
    """One payload's bytes; an ``EncodeError`` naming the value's type if msgspec refuses it."""
    try:
        return _encode(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise EncodeError(
            f"cannot publish a {type(value).__name__} ({err}): a channel carries values msgspec "
            "can encode (str, bytes, numbers, lists, dicts, msgspec Structs, dataclasses...)"
        ) from err


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def pack(publisher: bytes, seq: int, payloads: list[bytes]) -> bytes:
    """A frame from the publisher's encoded id, the first sequence number and encoded payloads."""
    return b"".join((b"\x93", publisher, _encode(seq), _array_header(len(payloads)), *payloads))


def decode(frame: bytes) -> tuple[str, int, list[Any]]:
    """``(publisher, first_seq, values)``; a ``DecodeError`` if ``frame`` is not a frame."""
    try:
        return _decoder.decode(frame)
    except msgspec.DecodeError as err:
        raise DecodeError(f"not a hurtle channel frame ({len(frame)} bytes): {err}") from err


def publisher_bytes(publisher: str) -> bytes:
    """The encoded publisher id, computed once per publisher."""
    return _encode(publisher)
