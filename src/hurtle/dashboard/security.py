"""Who may use the dashboard: the access token, sessions, CSRF and Host checks, safety headers.

Without a token (``HURTLE_DASHBOARD_TOKEN`` or ``create_app(token=…)``) requests are let in only
when their ``Host`` is a loopback name (``127.0.0.1``, ``localhost``, ``[::1]``, any port): a
page of another site that has its name resolve to 127.0.0.1 (DNS rebinding) gets 403.
``hurtle dashboard`` then refuses to listen anywhere but on loopback. A token must be at least
``MIN_TOKEN`` characters of visible ASCII (a trailing newline, as secret files have, is dropped).
With one, every page, API call and ``/metrics`` needs either the header
``Authorization: Bearer <token>`` or the session cookie the login page sets (a random id that
ends at logout or after ``sessions.SESSION_LIFETIME``; HttpOnly, SameSite=Strict, and Secure
when the request came over HTTPS). Pages without either go to ``/login``; the rest get 401.
Wrong tokens, at the login page or as a bearer token, are throttled per client
(``sessions.Throttle``): past a few, the client gets 429 until its wait is over.

Behind a reverse proxy, ``trust_proxy`` (``HURTLE_DASHBOARD_TRUST_PROXY=1``) makes the dashboard
take the client's address from the last ``X-Forwarded-For`` entry and HTTPS from
``X-Forwarded-Proto``; set it only when every request comes through that proxy.

State-changing requests (anything but GET, HEAD, OPTIONS) are refused with 403 when their
``Origin`` names another site, and, when a cookie authenticates them, unless the header
``X-CSRF-Token`` equals the ``hurtle_csrf`` cookie (double submit: another site can neither read
that cookie nor set the header without a CORS preflight, which the dashboard never grants).
A bearer token needs no CSRF check: browsers never send it on their own.

Every answer carries ``X-Frame-Options: DENY`` and a Content-Security-Policy that allows the
dashboard's own scripts and styles only and no framing (``frame-ancestors 'none'``).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from .sessions import Sessions, Throttle

TOKEN_ENV = "HURTLE_DASHBOARD_TOKEN"
TRUST_PROXY_ENV = "HURTLE_DASHBOARD_TRUST_PROXY"
#: The shortest access token accepted.
MIN_TOKEN = 16
SESSION_COOKIE = "hurtle_session"
CSRF_COOKIE = "hurtle_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Paths open without a token: the login page, logout, and what the login page needs.
OPEN_PATHS = frozenset({"/login", "/logout", "/static/app.css", "/favicon.ico"})
#: Sent with every answer (unless the app set the header itself).
SAFETY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]

Scope = MutableMapping[str, Any]


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


def clean_token(raw: str | None, source: str = TOKEN_ENV) -> str | None:
    """The access token ``raw`` as it will be compared: None for none, else a checked string.

    A trailing newline (secret files end with one) is dropped; a token shorter than
    ``MIN_TOKEN`` or holding spaces or control characters is refused: it could be guessed, or
    could never be sent in an ``Authorization`` header as it is.
    """
    if not raw:
        return None
    token = raw.rstrip("\r\n")
    remedy = (
        "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))', "
        "or leave it unset to serve on loopback only"
    )
    if len(token) < MIN_TOKEN:
        raise ConfigurationError(
            f"{source} is {len(token)} characters long: the dashboard's access token needs at "
            f"least {MIN_TOKEN}; {remedy}"
        )
    bad = next((c for c in token if not (33 <= ord(c) <= 126)), None)
    if bad is not None:
        raise ConfigurationError(
            f"{source} holds {bad!r} at position {token.index(bad)}: an access token is sent in "
            f"an HTTP header and may hold only visible ASCII (no spaces); {remedy}"
        )
    return token


def trust_proxy_from(raw: str | None) -> bool:
    value = (raw or "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigurationError(
        f"{TRUST_PROXY_ENV}={raw!r}: say 1 (the dashboard is reached only through a reverse "
        "proxy that sets X-Forwarded-For and X-Forwarded-Proto) or 0"
    )


def from_environment(environ: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """The dashboard's ``HURTLE_*`` settings: (access token, trust the proxy's headers)."""
    env = os.environ if environ is None else environ
    return clean_token(env.get(TOKEN_ENV)), trust_proxy_from(env.get(TRUST_PROXY_ENV))


@functools.lru_cache(maxsize=256)  # a handful of names in use: parse each once
def host_problem(host: str | None) -> str | None:
    """Why a tokenless dashboard refuses a request addressed to ``host`` (None: it does not)."""
    try:
        name = urlsplit("//" + (host or "")).hostname
        urlsplit("//" + (host or "")).port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        name = None
    if name and is_loopback(name):
        return None
    return (
        f"this dashboard has no access token, so it answers only requests addressed to "
        f"127.0.0.1, localhost or [::1], not {host!r}; to serve it under another name set "
        f"{TOKEN_ENV}"
    )


@dataclass
class Access:
    """What the guard and the login routes share: the token, sessions and the throttle."""

    token: str | None
    trust_proxy: bool = False
    sessions: Sessions = field(default_factory=Sessions)
    throttle: Throttle = field(default_factory=Throttle)

    def client(self, scope: Scope) -> str:
        """Who is asking, for the throttle: an address."""
        if self.trust_proxy:
            forwarded = _header(scope, b"x-forwarded-for")
            if forwarded:
                return forwarded.rsplit(",", 1)[-1].strip()
        client = scope.get("client")
        return str(client[0]) if client else "unknown"

    def https(self, scope: Scope) -> bool:
        """Whether the browser reached the dashboard over HTTPS (its cookies then are Secure)."""
        if scope.get("scheme") == "https":
            return True
        if self.trust_proxy:
            proto = _header(scope, b"x-forwarded-proto") or ""
            return proto.split(",", 1)[0].strip().lower() == "https"
        return False

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(
            given.encode("utf-8", "replace"), self.token.encode()
        )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


def cookies(headers: dict[str, str]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed cookie header counts as none
        return {}
    return {k: m.value for k, m in jar.items()}


def with_safety_headers(send: Any) -> Any:
    """``send`` that adds ``SAFETY_HEADERS`` to the answer's start."""

    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            present = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in SAFETY_HEADERS if k not in present]
            message = {**message, "headers": headers}
        await send(message)

    return wrapped


class Guard:
    """ASGI middleware enforcing the rules of the module doc."""

    def __init__(self, app: Any, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = with_safety_headers(send)
        access = self.access
        headers = _headers(scope)
        if not access.token:
            problem = host_problem(headers.get("host"))
            if problem:
                await send_json(send, 403, {"error": problem})
                return
        jar = cookies(headers)
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        local = path[len(root) :] if root and path.startswith(root) else path
        by_cookie = False
        if access.token and local not in OPEN_PATHS:
            bearer = headers.get("authorization", "")
            if bearer.lower().startswith("bearer "):
                client = access.client(scope)
                wait = access.throttle.wait(client)
                if wait:
                    await send_json(send, 429, {"error": too_many(wait)}, retry_after(wait))
                    return
                if not access.token_matches(bearer[7:].strip()):
                    access.throttle.failed(client)
                    await send_json(send, 401, {"error": "wrong access token"}, [_CHALLENGE])
                    return
                access.throttle.succeeded(client)
            elif access.sessions.valid(jar.get(SESSION_COOKIE, "")):
                by_cookie = True
            else:
                await self._unauthorized(scope, send, local, root)
                return
        else:
            by_cookie = bool(jar)
        if scope["method"] not in SAFE_METHODS:
            problem = _csrf_problem(headers, jar, by_cookie and local not in OPEN_PATHS)
            if problem:
                await send_json(send, 403, {"error": problem})
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
        await send_json(
            send,
            401,
            {
                "error": "this dashboard needs its access token: send the header "
                "'Authorization: Bearer <token>' or log in at /login"
            },
            [_CHALLENGE],
        )


_CHALLENGE = (b"www-authenticate", b'Bearer realm="hurtle"')


def too_many(wait: float) -> str:
    return f"too many wrong access tokens from this address: try again in {max(1, round(wait))} s"


def retry_after(wait: float) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", str(max(1, round(wait + 0.5))).encode())]


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


async def send_json(
    send: Any, status: int, doc: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_json_body(send, status, json.dumps(doc).encode(), extra)


async def send_json_body(
    send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer with ``body``, a JSON document already encoded, straight through ASGI."""
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
