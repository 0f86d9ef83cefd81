"""How much of a request body the dashboard reads: a cap per route and a budget for all at once.

``BodyLimit`` reads every request body, with ``read_body``, the one loop that reads one (the
enqueue lane of ``web.py`` reads with it too, what ``BodyLimit`` replays). Each route has a cap
(a login form needs a few KB, a list of dead-letter ids at most ``IDS_BODY``, an enqueue
``web.MAX_BODY``; anything else ``SMALL_BODY``); a declared ``Content-Length`` over it gets 413
before a byte of the body is read, and an undeclared (chunked) body is read only until it passes
the cap. The bytes of the bodies being read or handled at one time are bounded by a shared
``BodyBudget``: a request that would exceed it waits for room up to ``BUDGET_WAIT`` seconds,
then gets 503 with ``Retry-After``. What the budget admits is read whole, then handed to the
app as one message, so the routes behind it never see more than their cap.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import anyio

from .security import send_json

#: The login form: a token and little else.
LOGIN_BODY = 4 * 1024
#: ``{"ids": [...]}`` for retrying or deleting dead letters: thousands of ids, not millions.
IDS_BODY = 1024 * 1024
#: Any other route: they take no body, but a client may send ``{}``.
SMALL_BODY = 4 * 1024
#: Body bytes all requests may hold at once.
BODY_BUDGET = 32 * 1024 * 1024
#: How long a request waits for room in the budget before it gets 503.
BUDGET_WAIT = 10.0

Scope = dict[str, Any]


class BodyBudget:
    """Bytes that request bodies may hold at once, shared by every request of one app."""

    def __init__(self, total: int = BODY_BUDGET, wait: float = BUDGET_WAIT) -> None:
        self.total = total
        self.wait = wait
        self.used = 0

    async def take(self, n: int) -> bool:
        """Reserve ``n`` bytes, waiting up to ``wait`` seconds for room; False if none came."""
        deadline = time.monotonic() + self.wait
        while self.used + n > self.total:
            if time.monotonic() >= deadline:
                return False
            await anyio.sleep(0.01)  # rare (the budget is full): polling keeps it loop-agnostic
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class BodyLimit:
    """ASGI middleware: read each request body within its route's cap and the shared budget.

    ``caps`` are (path regex, bytes) pairs, matched in order against the path below the app's
    mount point; a path none matches gets ``SMALL_BODY``.
    """

    def __init__(
        self, app: Any, caps: Sequence[tuple[str, int]], budget: BodyBudget | None = None
    ) -> None:
        self.app = app
        self.caps = [(re.compile(pattern), cap) for pattern, cap in caps]
        self.budget = budget or BodyBudget()

    def cap(self, path: str) -> int:
        for pattern, cap in self.caps:
            if pattern.fullmatch(path):
                return cap
        return SMALL_BODY

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _refuse(send, 400, "the Content-Length header is not a number")
                    return
            elif name == b"transfer-encoding":
                chunked = True
        if not chunked and not length:
            await self.app(scope, receive, send)  # no body: nothing to read or hold
            return
        path, root = scope.get("path", ""), scope.get("root_path", "")
        cap = self.cap(path[len(root) :] if root and path.startswith(root) else path)
        if length is not None and length > cap:
            await _refuse(send, 413, _too_large(cap))
            return
        want = length if length is not None else cap
        if want > self.budget.total:
            await _refuse(send, 413, _too_large(self.budget.total))
            return
        if not await self.budget.take(want):
            await _refuse(
                send,
                503,
                "the dashboard is reading as many request bodies as it may hold; "
                "send again in a moment",
                [(b"retry-after", b"1")],
            )
            return
        try:
            try:
                body = await read_body(receive, cap)
            except BodyTooLarge as err:
                await _refuse(send, 413, str(err))
                return
            if body is not None:
                await self.app(scope, _replay(body, receive), send)
        finally:
            self.budget.give(want)


class BodyTooLarge(Exception):
    """A request body passed its route's cap while it was read."""

    def __init__(self, cap: int) -> None:
        super().__init__(_too_large(cap))


async def read_body(receive: Any, cap: int) -> bytes | None:
    """A request's whole body, from its ASGI ``receive``; None if the client went away first.
    Raises ``BodyTooLarge`` as soon as more than ``cap`` bytes came."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(cap)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives the body read already, then what the server sends next."""
    pending: list[bytes] = [body]

    async def replayed() -> dict[str, Any]:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        message: dict[str, Any] = await receive()
        return message

    return replayed


def _too_large(cap: int) -> str:
    return f"the request body exceeds {cap} bytes, the most this route reads"


async def _refuse(
    send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    # the body was not read (or not all of it): the connection cannot carry another request
    await send_json(send, status, {"error": text}, [(b"connection", b"close"), *(extra or [])])
