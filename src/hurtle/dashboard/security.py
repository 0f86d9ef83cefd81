"""Who may use the dashboard: an access token, a session cookie, and CSRF checks.

Without a token (``HURTLE_DASHBOARD_TOKEN`` or ``create_app(token=…)``) every request is let in:
``hurtle dashboard`` then refuses to listen anywhere but on loopback. With one, every page,
API call and ``/metrics`` needs either the header ``Authorization: Bearer <token>`` or the
session cookie the login page sets (HttpOnly, SameSite=Strict; its value is an HMAC of the
token, never the token). Pages without either go to ``/login``; the rest get 401.

State-changing requests (anything but GET, HEAD, OPTIONS) are refused with 403 when their
``Origin`` names another site, and, when a cookie authenticates them, unless the header
``X-CSRF-Token`` equals the ``hurtle_csrf`` cookie (double submit: another site can neither read
that cookie nor set the header without a CORS preflight, which the dashboard never grants).
A bearer token needs no CSRF check: browsers never send it on their own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError

TOKEN_ENV = "HURTLE_DASHBOARD_TOKEN"
SESSION_COOKIE = "hurtle_session"
CSRF_COOKIE = "hurtle_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Paths open without a token: the login page and what it needs.
OPEN_PATHS = frozenset({"/login", "/static/app.css"})

Scope = dict[str, Any]


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, token: str | None) -> None:
    """Refuse to serve off loopback without a token."""
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} without an access token: anyone who "
            f"can reach that address could read and change the queues; set {TOKEN_ENV} to a "
            "long random secret (every request must then carry it), or listen on 127.0.0.1"
        )


def session_value(token: str) -> str:
    """The session cookie for ``token``: proves the login without holding the token."""
    return hmac.new(token.encode(), b"hurtle-dashboard-session", hashlib.sha256).hexdigest()


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


def cookies(headers: dict[str, str]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed cookie header counts as none
        return {}
    return {k: m.value for k, m in jar.items()}


class Guard:
    """ASGI middleware enforcing the rules of the module doc."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token or None
        self.session = session_value(self.token) if self.token else None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        jar = cookies(headers)
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        local = path[len(root) :] if root and path.startswith(root) else path
        by_cookie = False
        if self.token and local not in OPEN_PATHS:
            bearer = headers.get("authorization", "")
            if bearer.lower().startswith("bearer ") and hmac.compare_digest(
                bearer[7:].strip().encode(), self.token.encode()
            ):
                pass
            elif self.session and hmac.compare_digest(
                jar.get(SESSION_COOKIE, "").encode(), self.session.encode()
            ):
                by_cookie = True
            else:
                await self._unauthorized(scope, send, local, root)
                return
        else:
            by_cookie = bool(jar)
        if scope["method"] not in SAFE_METHODS:
            problem = _csrf_problem(headers, jar, by_cookie and local not in OPEN_PATHS)
            if problem:
                await _send_json(send, 403, {"error": problem})
                return
        await self.app(scope, receive, send)

    async def _unauthorized(self, scope: Scope, send: Any, local: str, root: str) -> None:
        wants_page = scope["method"] == "GET" and not (
            local.startswith("/api/") or local == "/metrics"
        )
        if wants_page:
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", f"{root}/login".encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await _send_json(
            send,
            401,
            {
                "error": "this dashboard needs its access token: send the header "
                "'Authorization: Bearer <token>' or log in at /login"
            },
            [(b"www-authenticate", b'Bearer realm="hurtle"')],
        )


def _csrf_problem(headers: dict[str, str], jar: dict[str, str], by_cookie: bool) -> str | None:
    origin = headers.get("origin")
    if origin and origin != "null":
        if urlsplit(origin).netloc != headers.get("host", ""):
            return f"cross-site request refused (Origin {origin!r})"
    elif origin == "null":
        return "cross-site request refused (Origin null)"
    if by_cookie:
        expected = jar.get(CSRF_COOKIE, "")
        sent = headers.get(CSRF_HEADER, "")
        if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            return (
                "missing or wrong CSRF token: send the hurtle_csrf cookie's value in the "
                "X-CSRF-Token header (or authenticate with a bearer token)"
            )
    return None


async def _send_json(
    send: Any, status: int, doc: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(doc).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
