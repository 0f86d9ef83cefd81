"""Sealed arguments and results: AES-GCM with the app's ``encryption_keys``.

A task registered with ``encrypt=True`` (or every task of an app made with ``encrypt=True``)
has its arguments sealed where they are sent and opened in the worker just before the call, and
its results sealed before they are stored and opened where they are read (handles, workflows).
What the broker holds of them is a ``Sealed`` value: a MessagePack extension (type ``EXT``)
whose bytes are::

    version (1) | key id (4) | nonce (12) | AES-256-GCM ciphertext and tag

The key id is the first 4 bytes of a SHA-256 of the key: opening goes straight to the key that
sealed, and a value sealed with a key this app does not have fails with a ``SealError`` naming
both. The first of ``encryption_keys`` seals; every one of them opens (key rotation: put the new
key first, keep the old one after it until nothing sealed with it is left). The associated data
binds a sealed value to its task's name and to what it is (arguments or a result): sealed
arguments cannot be moved to another task's message, nor a result passed off as arguments.

A sealed message carries its arguments as ``args=(sealed,)``, ``kwargs={}``, and its key id in
``headers["sealed"]``: the worker's inline path reads headers only when there are some, so a
message without headers pays nothing for this, and one with headers a dict lookup. The task's
name, queue, id, priority, times and headers are not sealed: brokers route and show them.

Nonces are 8 random bytes chosen per process (again after a fork) and a 4-byte counter, with
new random bytes every 2**32 values: never one twice under a key.

``cryptography`` is imported only when a ``Keyring`` is made (``pip install 'hurtle[crypto]'``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .errors import ConfigurationError, SealError
from .message import Message

#: The header of a message whose arguments are sealed: the id (hex) of the key that sealed them.
SEALED = "sealed"
#: The MessagePack extension type of a sealed value.
EXT = 83
#: Bytes in a key (AES-256).
KEY_SIZE = 32
_VERSION = 1
_ID_SIZE = 4
_NONCE_SIZE = 12
_HEAD = 1 + _ID_SIZE + _NONCE_SIZE
_TAG_SIZE = 16
#: What a sealed value is, in its associated data (with its task's name).
_ARGS = b"hurtle args\x00"
_RESULT = b"hurtle result\x00"

Sealed = msgspec.msgpack.Ext
_encode = msgspec.msgpack.Encoder().encode
_decode_call = msgspec.msgpack.Decoder(tuple[tuple[Any, ...], dict[str, Any]]).decode
_decode_value = msgspec.msgpack.decode
_replace = msgspec.structs.replace


def new_key() -> str:
    """A new random key, as the URL-safe base64 text ``encryption_keys`` and
    ``HURTLE_ENCRYPTION_KEYS`` take."""
    return base64.urlsafe_b64encode(os.urandom(KEY_SIZE)).decode("ascii")


def parse_key(value: object, where: str) -> bytes:
    """The 32 bytes of a key given as bytes or as URL-safe base64 text (what ``new_key``
    returns); ``ConfigurationError`` naming ``where`` (never the key) when it is neither."""
    if isinstance(value, bytes | bytearray):
        key = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                f"{where} is not URL-safe base64 text ({len(text)} characters): give 32 random "
                "bytes, or their base64 text, such as hurtle.new_key() returns"
            ) from None
    else:
        raise ConfigurationError(
            f"{where} must be 32 bytes or their URL-safe base64 text, got "
            f"{type(value).__name__}: give os.urandom(32), or hurtle.new_key()"
        )
    if len(key) != KEY_SIZE:
        raise ConfigurationError(
            f"{where} is {len(key)} bytes, not {KEY_SIZE}: an AES-256 key is 32 random bytes "
            "(os.urandom(32)), or their base64 text (hurtle.new_key())"
        )
    return key


def key_id(key: bytes) -> bytes:
    """The 4 bytes that name ``key`` in what it seals (a hash: they tell nothing of it)."""
    return hashlib.sha256(b"hurtle key id\x00" + key).digest()[:_ID_SIZE]


def is_sealed(value: object) -> bool:
    """True when ``value`` is a sealed value (as decoded from MessagePack)."""
    return type(value) is Sealed and value.code == EXT


def sealed_by(value: Sealed) -> str:
    """The id (hex) of the key that sealed ``value``."""
    return bytes(value.data)[1 : 1 + _ID_SIZE].hex()


def shown(value: Sealed) -> str:
    """How a sealed value is shown where it cannot be opened: ``sealed (key 3f2a9c01)``."""
    return f"sealed (key {sealed_by(value)})"


def is_sealed_message(message: Message) -> bool:
    headers = message.headers
    return bool(headers) and SEALED in headers


class _Nonces:
    """Unique 12-byte nonces: 8 random bytes and a counter; new random bytes in a forked child
    and when the counter is spent. The bytes and the counter are read as one pair (``state``),
    so two threads never combine a new prefix with an old count."""

    SPENT = 0xFFFFFFFF

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (8 random bytes, their counter): read once per nonce, replaced whole.
        self.state = (os.urandom(8), itertools.count())
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self.state = (os.urandom(8), itertools.count())

    def spent(self, state: tuple[bytes, itertools.count[int]]) -> None:
        """Called when ``state``'s counter reached ``SPENT``: new random bytes, once."""
        with self._lock:
            if self.state is state:
                self._reseed()

    def next(self) -> bytes:
        while True:
            state = self.state
            n = next(state[1])
            if n < self.SPENT:
                return state[0] + n.to_bytes(4, "big")
            self.spent(state)


_nonces = _Nonces()


class Keyring:
    """The app's keys: the first seals, any opens. Made once per app (``Hurtle``)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ConfigurationError("encryption_keys is empty: give at least one key")
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise ConfigurationError(
                "encryption_keys need the cryptography package: pip install 'hurtle[crypto]'"
            ) from None
        first = keys[0]
        self._id = key_id(first)
        #: The id (hex) of the key that seals.
        self.id = self._id.hex()
        self._seal = AESGCM(first).encrypt
        self._head = bytes([_VERSION]) + self._id
        self._open: dict[bytes, Callable[[bytes, bytes, bytes], bytes]] = {}
        for key in keys:
            self._open.setdefault(key_id(key), AESGCM(key).decrypt)
        #: The ids (hex) of every key that opens, first the one that seals.
        self.ids = [k.hex() for k in self._open]
        self._digest_key = hashlib.sha256(b"hurtle digest\x00" + first).digest()
        from cryptography.exceptions import InvalidTag

        self._invalid = InvalidTag

    def __repr__(self) -> str:  # never the keys
        return f"<Keyring seals with {self.id}, opens {', '.join(self.ids)}>"

    # -- values --------------------------------------------------------------------------------

    def seal(self, plaintext: bytes, aad: bytes) -> Sealed:
        nonce = _nonces.next()
        return Sealed(EXT, self._head + nonce + self._seal(nonce, plaintext, aad))

    def sealer(self, task: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Sealed]:
        """What seals the calls of ``task``: ``seal_call`` for one task, its associated data
        made once and the nonce made inline (the same nonces as ``_Nonces.next``).
        ``send_many`` seals each call with it as it builds the call's message."""
        aad, head, seal, encode = _ARGS + task.encode(), self._head, self._seal, _encode
        nonces, spent, ext = _nonces, _nonces.SPENT, Sealed

        def sealed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sealed:
            state = nonces.state
            n = next(state[1])
            while n >= spent:  # the counter is spent: new random bytes, a new counter
                nonces.spent(state)
                state = nonces.state
                n = next(state[1])
            nonce = state[0] + n.to_bytes(4, "big")
            return ext(EXT, head + nonce + seal(nonce, encode((args, kwargs)), aad))

        return sealed

    def open(self, value: object, aad: bytes, what: str) -> bytes:
        """The plaintext of sealed ``value``; ``SealError`` saying why it cannot be had, with
        ``what`` naming what it is (``arguments of task x``)."""
        if not is_sealed(value):
            raise SealError(f"cannot open the {what}: not sealed, as its task's are")
        assert isinstance(value, Sealed)
        data = bytes(value.data)  # bytes already, as decoded: no copy
        if len(data) < _HEAD + _TAG_SIZE or data[0] != _VERSION:
            raise SealError(f"cannot open the {what}: sealed in a form this hurtle cannot read")
        kid = data[1 : 1 + _ID_SIZE]
        opener = self._open.get(kid)
        if opener is None:
            raise SealError(
                f"cannot open the {what}: sealed with key {kid.hex()}, which is not among this "
                f"app's encryption_keys (keys {', '.join(self.ids)}); add that key after the "
                "first (HURTLE_ENCRYPTION_KEYS=new,old) to open them"
            )
        try:
            return opener(data[1 + _ID_SIZE : _HEAD], data[_HEAD:], aad)
        except self._invalid:
            raise SealError(
                f"cannot open the {what}: key {kid.hex()} does not open what was sealed "
                "(tampered with, or sealed for another task)"
            ) from None

    def digest(self, data: bytes) -> str:
        """A keyed hash of ``data`` (hex): the unique lock of an encrypted task's call, which
        tells nothing of its arguments to whoever lacks the key."""
        return hashlib.blake2b(data, key=self._digest_key, digest_size=16).hexdigest()

    # -- calls and results ---------------------------------------------------------------------

    def seal_call(self, task: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sealed:
        return self.seal(_encode((args, kwargs)), _ARGS + task.encode())

    def open_call(self, task: str, value: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return _decode_call(self.open(value, _ARGS + task.encode(), f"arguments of task {task}"))

    def seal_value(self, task: str, value: Any) -> Sealed:
        """``value`` (a result) sealed; raises what msgspec raises on what it cannot encode."""
        return self.seal(_encode(value), _RESULT + task.encode())

    def open_value(self, task: str, value: object) -> Any:
        return _decode_value(self.open(value, _RESULT + task.encode(), f"result of task {task}"))

    def seal_message(self, m: Message) -> Message:
        """``m`` with its arguments sealed (and the sealing key's id in its headers)."""
        return _replace(
            m,
            args=(self.seal_call(m.task, m.args, m.kwargs),),
            kwargs={},
            headers={**m.headers, SEALED: self.id},
        )

    def open_message(self, m: Message) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments of sealed message ``m``; ``SealError`` when they cannot be opened."""
        if len(m.args) != 1 or m.kwargs:
            raise SealError(
                f"cannot open the arguments of task {m.task}: they are not one sealed value, "
                "as its header says"
            )
        return self.open_call(m.task, m.args[0])

    def prepend(self, m: Message, first: tuple[Any, ...]) -> Message:
        """Sealed message ``m`` with ``first`` put before its own arguments, sealed again (a
        workflow's result passed on)."""
        args, kwargs = self.open_message(m)
        return _replace(
            m,
            args=(self.seal_call(m.task, (*first, *args), kwargs),),
            kwargs={},
            headers={**m.headers, SEALED: self.id},
        )

    def opening(self, task: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """What the worker calls with the arguments of a message of ``task`` whose arguments
        are sealed (``Task.run``): opens them, then calls ``fn``. Arguments that are not one
        sealed value raise ``SealError``: an encrypted task never runs unsealed arguments.

        The worker's one per-call cost of encryption, kept to the decryption itself: what
        cannot be opened at once takes ``open``, which says why."""
        aad = _ARGS + task.encode()
        what = f"arguments of task {task}"
        # by the 5 bytes a sealed value opens with (version and key id): one slice and one
        # lookup find the key, and tell the version too
        heads = {bytes([_VERSION]) + kid: opener for kid, opener in self._open.items()}
        decode, ext = _decode_call, Sealed
        head, nonce, body = slice(0, 1 + _ID_SIZE), slice(1 + _ID_SIZE, _HEAD), slice(_HEAD, None)

        def run(value: Any = None, /, *rest: Any, **kwargs: Any) -> Any:
            if type(value) is ext and not rest and not kwargs and value.code == EXT:
                data: bytes = value.data  # type: ignore[assignment]  # bytes, as decoded
                opener = heads.get(data[head])
                if opener is not None:
                    try:
                        call, keywords = decode(opener(data[nonce], data[body], aad))
                    except Exception:  # said precisely below
                        pass
                    else:
                        # an empty ``**keywords`` would cost the call a dict
                        return fn(*call, **keywords) if keywords else fn(*call)
            if rest or kwargs or type(value) is not ext:
                raise SealError(f"cannot open the {what}: not sealed, as its task's are")
            call, keywords = decode(self.open(value, aad, what))
            return fn(*call, **keywords)

        run.__wrapped__ = fn  # type: ignore[attr-defined]
        return run


def readable_call(
    task: str, args: Sequence[Any], kwargs: dict[str, Any], keyring: Keyring | None
) -> tuple[list[Any], dict[str, Any]]:
    """A call's arguments as shown to people (the dashboard, ``hurtle dead``): opened with
    ``keyring`` when they are sealed and it can, else the sealed value as its text
    (``sealed (key 3f2a9c01)``)."""
    if len(args) == 1 and not kwargs and is_sealed(args[0]):
        if keyring is not None:
            try:
                opened, keywords = keyring.open_call(task, args[0])
                return list(opened), dict(keywords)
            except (SealError, msgspec.DecodeError, msgspec.ValidationError):
                pass
        return [shown(args[0])], {}
    return list(args), dict(kwargs)


def readable_value(task: str, value: Any, keyring: Keyring | None) -> Any:
    """A result as shown to people: opened with ``keyring`` when it is sealed and it can,
    else its text (``sealed (key 3f2a9c01)``)."""
    if not is_sealed(value):
        return value
    if keyring is not None:
        try:
            return keyring.open_value(task, value)
        except (SealError, msgspec.DecodeError):
            pass
    return shown(value)


def keyring_of(keys: Sequence[bytes]) -> Keyring | None:
    """The keyring of ``keys``, or None when there are none."""
    return Keyring(keys) if keys else None


def keyring_for(task: str, encrypt: object, keyring: Keyring | None) -> Keyring | None:
    """What seals task ``task``'s calls: its app's ``keyring`` if ``encrypt``, else None;
    ``ConfigurationError`` when ``encrypt`` is not a bool, or True for an app without keys."""
    if not isinstance(encrypt, bool):
        raise ConfigurationError(
            f"task {task!r}: encrypt must be True or False, got {encrypt!r:.60}"
        )
    if not encrypt:
        return None
    if keyring is None:
        raise ConfigurationError(
            f"task {task!r}: encrypt=True needs the app's encryption_keys; make the app with "
            "Hurtle(encryption_keys=[key]) or set HURTLE_ENCRYPTION_KEYS (a key: "
            "hurtle.new_key())"
        )
    return keyring


def no_keys(what: str) -> SealError:
    """The error of ``what`` (sealed) met by an app without ``encryption_keys``."""
    return SealError(
        f"cannot open the {what}: sealed, and this app has no encryption_keys; make it "
        "with the keys that sealed them (Hurtle(encryption_keys=[...]) or "
        "HURTLE_ENCRYPTION_KEYS)"
    )


def open_message(keyring: Keyring | None, m: Message) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of sealed message ``m`` with ``keyring``; ``SealError`` if it cannot."""
    if keyring is None:
        raise no_keys(f"arguments of task {m.task}")
    return keyring.open_message(m)


__all__ = [
    "EXT",
    "KEY_SIZE",
    "SEALED",
    "Keyring",
    "Sealed",
    "is_sealed",
    "is_sealed_message",
    "key_id",
    "new_key",
    "open_message",
    "parse_key",
    "readable_call",
    "readable_value",
    "sealed_by",
    "shown",
]
