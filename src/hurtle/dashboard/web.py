"""The dashboard's ASGI app: pages, the JSON API under ``/api/``, ``/metrics``.

The pages are one static HTML page and a small script (``static/``), served from the package,
that read the JSON API; the overview's chart follows ``/api/throughput/stream`` (server-sent
events). Everything the pages show or do goes through the API, described by
``/api/openapi.json``. Request bodies are parsed as JSON only: nothing received is ever unpickled
or evaluated.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import anyio.to_thread
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..app import Hurtle
from ..brokers import Broker
from ..errors import BrokerError, EncodeError
from ..ids import new_id
from ..message import Message
from ..names import QUEUE_NAME_RULE, queue_name_problem, task_name_problem
from . import queries
from .batcher import Batcher
from .openapi import OPENAPI
from .security import CSRF_COOKIE, SESSION_COOKIE, TOKEN_ENV, Guard, new_csrf, session_value

#: Most dead letters one page of the API returns.
MAX_PAGE = 500
#: Most messages one enqueue request may carry, and the most bytes its body may have.
MAX_ENQUEUE = 10_000
MAX_BODY = 16 * 1024 * 1024


class BadRequest(Exception):
    """A request the API refuses with 400, and why."""


def create_app(
    target: Hurtle | Broker,
    *,
    token: str | None = None,
    sample_every: float = 1.0,
    batch_window: float = 0.002,
) -> Any:
    """The dashboard for ``target`` (an app, or a broker), as an ASGI app to serve or mount.

    ``token`` (default: ``HURTLE_DASHBOARD_TOKEN``) protects every page and API call
    (``security.py``). ``sample_every`` is how often the throughput chart gets a point;
    ``batch_window`` how long an enqueue request waits for others to share its broker call.
    """
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if isinstance(target, Hurtle):
        broker = target.broker
        declared = target.queues()
    else:
        broker, declared = target, []
    dash = _Dashboard(broker, declared, token, sample_every, batch_window)
    dash.app = target if isinstance(target, Hurtle) else None
    static = resources.files("hurtle.dashboard") / "static"
    app = Starlette(
        routes=[
            Route("/", dash.page),
            Route("/login", dash.login_page, methods=["GET"]),
            Route("/login", dash.login, methods=["POST"]),
            Route("/logout", dash.logout, methods=["POST"]),
            Route("/metrics", dash.metrics),
            Route("/api/openapi.json", dash.openapi),
            Route("/api/overview", dash.overview),
            Route("/api/throughput", dash.throughput),
            Route("/api/throughput/stream", dash.stream),
            Route("/api/queues", dash.queues),
            Route("/api/tasks", dash.tasks),
            Route("/api/tasks/{id}", dash.task),
            Route("/api/schedules", dash.schedules),
            Route("/api/delayed", dash.delayed),
            Route("/api/workers", dash.workers),
            Route("/api/queues/{queue}/messages", dash.enqueue, methods=["POST"]),
            Route("/api/queues/{queue}/messages", dash.purge_waiting, methods=["DELETE"]),
            Route("/api/queues/{queue}/pause", dash.pause, methods=["POST"]),
            Route("/api/queues/{queue}/resume", dash.resume, methods=["POST"]),
            Route("/api/queues/{queue}/dead", dash.dead_letters, methods=["GET"]),
            Route("/api/queues/{queue}/dead", dash.purge_dead, methods=["DELETE"]),
            Route("/api/queues/{queue}/dead/retry", dash.retry_dead, methods=["POST"]),
            Route("/api/queues/{queue}/dead/delete", dash.delete_dead, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(static)), name="static"),
        ]
    )
    app.add_middleware(_EnqueueLane, dashboard=dash)
    app.add_middleware(Guard, token=token)  # added last: runs first
    app.state.dashboard = dash
    return app


def _json(doc: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(doc, status_code=status)


def _error(status: int, text: str) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status)


async def _body(request: Request) -> Any:
    return _decode_json(await request.body())


def _decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as err:
        raise BadRequest(f"the request body is not JSON: {err}") from None


_encode_json = msgspec.json.Encoder().encode


class _EnqueueLane:
    """``POST /api/queues/{queue}/messages`` straight to the batcher, past Starlette's routing
    and request objects: the endpoint other programs hammer. Everything else goes on."""

    def __init__(self, app: Any, dashboard: _Dashboard) -> None:
        self.app = app
        self.dashboard = dashboard

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            root: str = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path.startswith("/api/queues/") and path.endswith("/messages"):
                queue = path[len("/api/queues/") : -len("/messages")]
                if queue and "/" not in queue:
                    await self._enqueue(queue, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _enqueue(self, queue: str, receive: Any, send: Any) -> None:
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                status, body = (
                    413,
                    _encode_json({"error": f"the request body exceeds {MAX_BODY} bytes"}),
                )
                break
            chunks.append(chunk)
            more = message.get("more_body", False)
        else:
            status, body = await self.dashboard.enqueue_body(queue, b"".join(chunks))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _bad_queue(request: Request) -> Response | None:
    """The 400 answer for a request whose path names no valid queue, or None."""
    problem = queue_name_problem(request.path_params["queue"])
    return None if problem is None else _error(400, f"{problem}; {QUEUE_NAME_RULE}")


def _ids_or_all(doc: Any) -> list[str] | None:
    """``{"ids": [...]}`` -> the ids; ``{"all": true}`` -> None (every one)."""
    if isinstance(doc, dict) and doc.get("all") is True and "ids" not in doc:
        return None
    ids = doc.get("ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadRequest('expected {"ids": ["<dead-letter id>", ...]} or {"all": true}')
    return ids


def _messages(queue: str, doc: Any) -> list[Message]:
    """Messages from ``{"task", "args", "kwargs", "priority", "eta"}`` or a list of those."""
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise BadRequest("nothing to enqueue: send a message object or a non-empty list")
    if len(items) > MAX_ENQUEUE:
        raise BadRequest(f"at most {MAX_ENQUEUE} messages per request, got {len(items)}")
    now = time.time()
    out = []
    for n, item in enumerate(items):
        where = f"message {n}" if isinstance(doc, list) else "the message"
        if not isinstance(item, dict):
            raise BadRequest(f'{where} is not an object: expected {{"task": "name", ...}}')
        unknown = set(item) - {"task", "args", "kwargs", "priority", "eta"}
        if unknown:
            raise BadRequest(
                f"{where} has unknown fields {sorted(unknown)}: use task, args, "
                "kwargs, priority, eta"
            )
        task, args, kwargs = item.get("task"), item.get("args", []), item.get("kwargs", {})
        if not isinstance(task, str) or not task:
            raise BadRequest(f'{where} needs "task": the task\'s name, a non-empty string')
        if (problem := task_name_problem(task)) is not None:
            raise BadRequest(f"{where}: {problem}")
        if not isinstance(args, list):
            raise BadRequest(f'{where}: "args" must be a list, got {type(args).__name__}')
        if not isinstance(kwargs, dict):
            raise BadRequest(f'{where}: "kwargs" must be an object')
        out.append(
            Message(
                id=new_id(),
                task=task,
                queue=queue,
                args=tuple(args),
                kwargs=kwargs,
                priority=item.get("priority", 0),
                eta=item.get("eta", 0.0),
                created=now,
            )
        )
    return out


class _Dashboard:
    def __init__(
        self,
        broker: Broker,
        declared: list[str],
        token: str | None,
        sample_every: float,
        batch_window: float,
    ) -> None:
        self.broker = broker
        self.declared = declared
        self.token = token
        self.sample_every = sample_every
        self.rates = queries.Throughput(broker, every=sample_every)
        self.batcher = Batcher(broker, window=batch_window)
        self._registry: Any = None
        #: The app, when the dashboard was made from one: its schedules, which tasks keep results.
        self.app: Hurtle | None = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    # -- pages ------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        html = (resources.files("hurtle.dashboard") / "static" / "index.html").read_text()
        response = HTMLResponse(html.replace("{{root}}", request.scope.get("root_path", "")))
        if not request.cookies.get(CSRF_COOKIE):
            response.set_cookie(
                CSRF_COOKIE,
                new_csrf(),
                samesite="strict",
                path=request.scope.get("root_path", "") or "/",
            )
        return response

    async def login_page(self, request: Request) -> Response:
        html = (resources.files("hurtle.dashboard") / "static" / "login.html").read_text()
        return HTMLResponse(html.replace("{{root}}", request.scope.get("root_path", "")))

    async def login(self, request: Request) -> Response:
        root = request.scope.get("root_path", "")
        # the login form is urlencoded: parsed here, without python-multipart
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0]
        if not self.token or not hmac.compare_digest(given.encode(), self.token.encode()):
            return RedirectResponse(f"{root}/login?failed=1", status_code=303)
        response = RedirectResponse(f"{root}/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session_value(self.token),
            httponly=True,
            samesite="strict",
            path=root or "/",
        )
        response.set_cookie(CSRF_COOKIE, new_csrf(), samesite="strict", path=root or "/")
        return response

    async def logout(self, request: Request) -> Response:
        root = request.scope.get("root_path", "")
        response = RedirectResponse(f"{root}/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=root or "/")
        return response

    # -- reading ----------------------------------------------------------------------------

    async def openapi(self, request: Request) -> Response:
        return _json(OPENAPI)

    async def overview(self, request: Request) -> Response:
        return _json(await self._run(queries.overview, self.broker, self.rates, self.declared))

    async def throughput(self, request: Request) -> Response:
        await self._run(self.rates.sample)
        return _json({"every": self.sample_every, "points": list(self.rates.history)})

    async def stream(self, request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            while True:
                point, _ = await self._run(self.rates.sample)
                yield f"event: throughput\ndata: {json.dumps(point)}\n\n".encode()
                if await request.is_disconnected():
                    return
                await asyncio.sleep(self.sample_every)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def queues(self, request: Request) -> Response:
        stats = await self._run(queries.queue_stats, self.broker, self.declared)
        return _json(queries.queue_rows(stats))

    async def tasks(self, request: Request) -> Response:
        return _json(await self._run(queries.tasks, self.broker))

    async def task(self, request: Request) -> Response:
        message_id = request.path_params["id"]
        if not message_id or len(message_id) > 200:
            return _error(400, "a message id is 1 to 200 characters")
        keeps = (
            {name: t.store_result for name, t in self.app.tasks.items()}
            if self.app is not None
            else None
        )
        queues = await self._run(queries.queue_names, self.broker, self.declared)
        row = await self._run(queries.task_lookup, self.broker, message_id, queues, keeps)
        return _json(row)

    async def schedules(self, request: Request) -> Response:
        if self.app is None:
            return _json({"time": time.time(), "known": False, "schedules": []})
        rows = await self._run(queries.schedule_rows, self.app)
        return _json({"time": time.time(), "known": True, "schedules": rows})

    async def delayed(self, request: Request) -> Response:
        return _json(await self._run(queries.delayed_rows, self.broker, self.declared))

    async def workers(self, request: Request) -> Response:
        _, reports = await self._run(self.rates.sample)
        return _json([queries.worker_row(r) for r in reports])

    async def dead_letters(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        queue = request.path_params["queue"]
        try:
            limit = int(request.query_params.get("limit", "100"))
            offset = int(request.query_params.get("offset", "0"))
        except ValueError:
            return _error(400, "limit and offset must be whole numbers")
        if not 0 < limit <= MAX_PAGE or offset < 0:
            return _error(400, f"limit must be 1 to {MAX_PAGE} and offset >= 0")
        dead = await self._run(self.broker.dead_letters, queue, limit, offset)
        return _json([queries.dead_letter_row(d) for d in dead])

    # -- changing ---------------------------------------------------------------------------

    async def enqueue(self, request: Request) -> Response:
        status, body = await self.enqueue_body(request.path_params["queue"], await request.body())
        return Response(body, status_code=status, media_type="application/json")

    async def enqueue_body(self, queue: str, raw: bytes) -> tuple[int, bytes]:
        """Enqueue what a request body holds: (status, JSON answer)."""
        if (problem := queue_name_problem(queue)) is not None:
            return 400, _encode_json({"error": f"{problem}; {QUEUE_NAME_RULE}"})
        try:
            doc = _decode_json(raw)
            messages = _messages(queue, doc)
            await self.batcher.publish(messages)
        except (BadRequest, EncodeError) as err:
            return 400, _encode_json({"error": str(err)})
        except BrokerError as err:  # nothing acknowledged: the client may send again
            return 503, _encode_json({"error": f"the broker failed; nothing was enqueued: {err}"})
        ids = [m.id for m in messages]
        return 201, _encode_json(
            {"ids": ids} if isinstance(doc, list) else {"id": ids[0], "ids": ids}
        )

    async def pause(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        queue = request.path_params["queue"]
        await self._run(self.broker.pause, queue)
        return _json({"queue": queue, "paused": True})

    async def resume(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        queue = request.path_params["queue"]
        await self._run(self.broker.resume, queue)
        return _json({"queue": queue, "paused": False})

    async def purge_waiting(self, request: Request) -> Response:
        """Drop the queue's ready and delayed messages; those in flight finish."""
        if (bad := _bad_queue(request)) is not None:
            return bad
        n = await self._run(self.broker.purge, request.path_params["queue"])
        return _json({"purged": n})

    async def purge_dead(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        n = await self._run(self.broker.purge_dead, request.path_params["queue"])
        return _json({"purged": n})

    async def retry_dead(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        try:
            ids = _ids_or_all(await _body(request))
        except BadRequest as err:
            return _error(400, str(err))
        n = await self._run(self.broker.retry_dead, request.path_params["queue"], ids)
        return _json({"retried": n})

    async def delete_dead(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        try:
            ids = _ids_or_all(await _body(request))
        except BadRequest as err:
            return _error(400, str(err))
        queue = request.path_params["queue"]
        if ids is None:
            n = await self._run(self.broker.purge_dead, queue)
        else:
            n = await self._run(self.broker.delete_dead, queue, ids)
        return _json({"deleted": n})

    # -- metrics ----------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        from .metrics import render

        if self._registry is None:
            from .metrics import registry

            self._registry = registry(self.broker, self.declared)
        body, content_type = await self._run(render, self._registry)
        return Response(body, media_type=content_type)
