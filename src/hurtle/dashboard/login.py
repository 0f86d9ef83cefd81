"""The login page, logging in and out: where a session begins and ends.

``POST /login`` takes the urlencoded form (``token=…``; its body is capped in ``bodies``),
checks the token in constant time, and on success starts a session (``sessions.Sessions``)
whose id goes into an HttpOnly, SameSite=Strict cookie, Secure over HTTPS, that expires with
it. A wrong token shows the form again with a message (401), and counts against the client in
the throttle; a client that must wait gets the form with how long (429). ``POST /logout`` ends
the session its cookie names and clears the cookies.
"""

from __future__ import annotations

import html
from importlib import resources
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .security import CSRF_COOKIE, SESSION_COOKIE, Access, retry_after, too_many
from .sessions import new_csrf


class Login:
    """The routes of the login page, bound to one dashboard's ``Access``."""

    def __init__(self, access: Access) -> None:
        self.access = access

    def routes(self) -> list[Route]:
        return [
            Route("/login", self.page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
        ]

    def _form(self, request: Request, message: str = "", status: int = 200) -> HTMLResponse:
        text = (resources.files("hurtle.dashboard") / "static" / "login.html").read_text()
        note = f'<p class="login-error" role="alert">{html.escape(message)}</p>' if message else ""
        text = text.replace("{{message}}", note)
        return HTMLResponse(
            text.replace("{{root}}", html.escape(request.scope.get("root_path", ""))),
            status_code=status,
        )

    async def page(self, request: Request) -> Response:
        return self._form(request)

    async def login(self, request: Request) -> Response:
        access = self.access
        root = request.scope.get("root_path", "")
        if access.token is None:
            return RedirectResponse(f"{root}/", status_code=303)  # nothing to log in to
        client = access.client(request.scope)
        wait = access.throttle.wait(client)
        if wait:
            refused = self._form(request, too_many(wait) + ".", 429)
            for name, value in retry_after(wait):
                refused.headers[name.decode()] = value.decode()
            return refused
        # the login form is urlencoded: parsed here, without python-multipart
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        if not access.token_matches((form.get("token") or [""])[0]):
            access.throttle.failed(client)
            return self._form(request, "That is not this dashboard's access token.", 401)
        access.throttle.succeeded(client)
        old = request.cookies.get(SESSION_COOKIE)
        if old:
            access.sessions.end(old)
        response = RedirectResponse(f"{root}/", status_code=303)
        secure = access.https(request.scope)
        response.set_cookie(
            SESSION_COOKIE,
            access.sessions.start(),
            max_age=int(access.sessions.lifetime),
            httponly=True,
            samesite="strict",
            secure=secure,
            path=root or "/",
        )
        response.set_cookie(
            CSRF_COOKIE, new_csrf(), samesite="strict", secure=secure, path=root or "/"
        )
        return response

    async def logout(self, request: Request) -> Response:
        root = request.scope.get("root_path", "")
        session = request.cookies.get(SESSION_COOKIE)
        if session:
            self.access.sessions.end(session)
        response = RedirectResponse(f"{root}/login", status_code=303)
        secure = self.access.https(request.scope)
        for name in (SESSION_COOKIE, CSRF_COOKIE):
            response.delete_cookie(
                name, path=root or "/", secure=secure, httponly=name == SESSION_COOKIE
            )
        return response


def set_csrf_cookie(response: Response, request: Request, access: Access) -> None:
    """Give a page its CSRF cookie, if the browser has none yet."""
    if not request.cookies.get(CSRF_COOKIE):
        response.set_cookie(
            CSRF_COOKIE,
            new_csrf(),
            samesite="strict",
            secure=access.https(request.scope),
            path=request.scope.get("root_path", "") or "/",
        )
