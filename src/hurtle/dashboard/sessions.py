"""Login sessions and the brake on guessing the access token.

A session is a random id (256 bits) that the login page hands out as a cookie; it proves one
login, not the token, and ends when it expires (``SESSION_LIFETIME``) or at logout. Sessions
live in the serving process: a restart ends them all, and a dashboard served by several
processes needs the bearer token (or sticky sessions) instead of the login page.

``Throttle`` counts wrong tokens per client (its address, as ``Access.client`` tells): the
first ``FREE_FAILURES`` cost nothing, then each one doubles the wait before the next try is
even checked, up to ``MAX_WAIT`` seconds. A right token clears the count.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict

#: How long a login lasts, in seconds (the cookie's Max-Age too).
SESSION_LIFETIME = 12 * 3600
#: Most sessions kept at once; past it the oldest ends.
MAX_SESSIONS = 10_000
#: Wrong tokens a client may send before it has to wait.
FREE_FAILURES = 5
#: The longest wait between two tries, in seconds.
MAX_WAIT = 60.0
#: A client whose last wrong token is this old (seconds) starts afresh.
FORGET_AFTER = 900.0
#: Most clients tracked at once; past it the one whose last failure is oldest is forgotten.
MAX_CLIENTS = 10_000


def new_csrf() -> str:
    """A value for the CSRF cookie (``security`` says how it is checked)."""
    return secrets.token_urlsafe(24)


def _key(session_id: str) -> bytes:
    # kept by digest: a lookup's timing says nothing about the ids held
    return hashlib.sha256(session_id.encode("utf-8", "replace")).digest()


class Sessions:
    """The live sessions of one dashboard: id -> when it ends."""

    def __init__(self, lifetime: float = SESSION_LIFETIME, limit: int = MAX_SESSIONS) -> None:
        self.lifetime = lifetime
        self.limit = limit
        self._ends: OrderedDict[bytes, float] = OrderedDict()

    def start(self) -> str:
        """A new session's id."""
        now = time.monotonic()
        while self._ends and (
            len(self._ends) >= self.limit or next(iter(self._ends.values())) <= now
        ):
            self._ends.popitem(last=False)  # oldest first: they were started in order
        session_id = secrets.token_urlsafe(32)
        self._ends[_key(session_id)] = now + self.lifetime
        return session_id

    def valid(self, session_id: str) -> bool:
        if not session_id:
            return False
        ends = self._ends.get(_key(session_id))
        return ends is not None and ends > time.monotonic()

    def end(self, session_id: str) -> None:
        self._ends.pop(_key(session_id), None)

    def __len__(self) -> int:
        return len(self._ends)


class Throttle:
    """Wrong tokens per client, and how long each must wait before its next try."""

    def __init__(self) -> None:
        self._clients: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def wait(self, client: str) -> float:
        """Seconds until ``client`` may try a token again (0: now)."""
        entry = self._clients.get(client)
        if entry is None:
            return 0.0
        failures, last = entry
        now = time.monotonic()
        if now - last > FORGET_AFTER:
            del self._clients[client]
            return 0.0
        if failures < FREE_FAILURES:
            return 0.0
        delay = min(2.0 ** (failures - FREE_FAILURES), MAX_WAIT)
        return max(0.0, last + delay - now)

    def failed(self, client: str) -> None:
        failures, _ = self._clients.pop(client, (0, 0.0))
        self._clients[client] = (failures + 1, time.monotonic())
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)
