"""The frame: how a burst of messages for one channel travels, as one msgpack array.

A frame is ``[publisher, seq, unsent, [payload, ...], epoch, number]``:

* ``publisher``: the publisher's id (a string drawn once per publisher and process; ``""`` for a
  mark: an empty frame that only carries a channel's count to a subscriber, see ``backend``);
* ``seq``: the publisher's own number of its first payload on this channel (repeats are told by
  it);
* ``unsent``: how many messages this publisher took for the channel and failed to send so far
  (flushes that raised: the broker was down);
* the payloads, each one msgpack value;
* ``epoch`` and ``number``: the channel's count, kept by the backend, not by the publisher. The
  backend numbers every message published to a channel, whoever published it, in the order the
  channel's subscribers receive them: ``number`` is that of the frame's first payload, and
  ``epoch`` tells one count from the next (a count not used for an hour is dropped and starts
  again, under a new epoch).

The publisher writes the first four elements (``pack``: payloads are encoded once, when
``publish`` is called, so that a value msgspec cannot encode fails there, in the caller, and a
frame is put together from those bytes without encoding them again); the backend appends the
last two (``count``) when it numbers the frame, in the same step that sends it. Subscribers
decode a frame in one call.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from ..errors import DecodeError, EncodeError

__all__ = ["MARK", "count", "decode", "encode_value", "pack", "publisher_bytes"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[str, int, int, list[Any], int, int])
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


def pack(publisher: bytes, seq: int, unsent: int, payloads: list[bytes]) -> bytes:
    """A frame less its count, from the publisher's encoded id, its first sequence number, its
    unsent messages so far and encoded payloads."""
    return b"".join(
        (b"\x96", publisher, _encode(seq), _encode(unsent), _array_header(len(payloads)), *payloads)
    )


def count(epoch: int, number: int) -> bytes:
    """What a backend appends to a packed frame: the channel count's epoch and the number of the
    frame's first message."""
    return _encode(epoch) + _encode(number)


#: An empty frame of no publisher: a mark (see ``redis``), to be completed by ``count``.
MARK = pack(_encode(""), 0, 0, [])


def decode(frame: bytes) -> tuple[str, int, int, list[Any], int, int]:
    """``(publisher, seq, unsent, values, epoch, number)``; a ``DecodeError`` if ``frame`` is not
    a frame."""
    try:
        return _decoder.decode(frame)
    except msgspec.DecodeError as err:
        raise DecodeError(f"not a hurtle channel frame ({len(frame)} bytes): {err}") from err


def publisher_bytes(publisher: str) -> bytes:
    """The encoded publisher id, computed once per publisher."""
    return _encode(publisher)
