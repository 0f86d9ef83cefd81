"""The dashboard's ASGI app: pages, the JSON API under ``/api/``, ``/metrics``.

The pages are one static HTML page and a small script (``static/``), served from the package,
that read the JSON API; the overview's chart follows ``/api/throughput/stream`` (server-sent
events). Everything the pages show or do goes through the API, described by
``/api/openapi.json``. Request bodies are parsed as JSON only: nothing received is ever unpickled
or evaluated.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Collection
from importlib import resources
from typing import Any

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
from ..errors import BrokerError, ConfigurationError, EncodeError
from ..names import QUEUE_NAME_RULE, queue_name_problem
from ..sealing import Keyring
from ..seconds import seconds_problem
from . import queries
from .batcher import Batcher
from .bodies import IDS_BODY, LOGIN_BODY, BodyBudget, BodyLimit, BodyTooLarge, read_body
from .enqueue import BadRequest, Enqueuer, decode_json
from .login import Login, set_csrf_cookie
from .names import FORGET_AFTER, IdleQueues, fold_counts
from .openapi import OPENAPI
from .reads import READ_TIMEOUT, Reads
from .security import Access, Guard, clean_token, from_environment, send_json_body

#: Most dead letters one page of the API returns.
MAX_PAGE = 500
#: Most bytes an enqueue request's body may have.
MAX_BODY = 16 * 1024 * 1024


def create_app(
    target: Hurtle | Broker,
    *,
    token: str | None = None,
    trust_proxy: bool | None = None,
    sample_every: float = 1.0,
    batch_window: float = 0.002,
    body_budget: int | None = None,
    allow_unknown_tasks: bool = False,
    forget_after: float = FORGET_AFTER,
    read_timeout: float = READ_TIMEOUT,
) -> Any:
    """The dashboard for ``target`` (an app, or a broker), as an ASGI app to serve or mount.

    ``token`` (default: ``HURTLE_DASHBOARD_TOKEN``; ``""`` for none) protects every page and API
    call, and ``trust_proxy`` (default: ``HURTLE_DASHBOARD_TRUST_PROXY``) says a reverse proxy's
    ``X-Forwarded-For``/``-Proto`` tell the client's address and scheme (``security.py``).
    ``sample_every`` is how often the throughput chart gets a point; ``batch_window`` how long
    an enqueue request waits for others to share its broker call; ``body_budget`` how many
    bytes of request bodies it holds at once (``bodies.py``). An enqueue names one of the app's
    tasks, with arguments that fit it, unless ``allow_unknown_tasks`` lets through names the
    dashboard has not the code of (``enqueue.py``). Queues empty and unused for
    ``forget_after`` seconds (an hour; 0: never) are forgotten, and task names the app does not
    register are counted as ``(other)`` (``names.py``). A read of the broker that takes more
    than ``read_timeout`` seconds (5) answers 503 rather than hang (``reads.py``).
    """
    problem = seconds_problem(
        forget_after, "forget_after", "a number of seconds (0: never)"
    ) or seconds_problem(read_timeout, "read_timeout")
    if problem is None and not read_timeout > 0:
        problem = f"read_timeout must be a number of seconds above 0, got {read_timeout!r}"
    if problem is not None:
        raise ConfigurationError(f"create_app: {problem}")
    env_token, env_trust = from_environment()
    token = env_token if token is None else clean_token(token, "the dashboard's token")
    access = Access(token, env_trust if trust_proxy is None else trust_proxy)
    if isinstance(target, Hurtle):
        broker = target.broker
        declared = target.queues()
    else:
        broker, declared = target, []
    dash = _Dashboard(broker, declared, access, sample_every, batch_window, read_timeout)
    dash.app = target if isinstance(target, Hurtle) else None
    dash.enqueuer = Enqueuer(
        dash.app.tasks if dash.app is not None else None, bool(allow_unknown_tasks)
    )
    dash.known = dash.app.tasks if dash.app is not None else frozenset()  # tasks added later too
    dash.idle = IdleQueues(broker, declared, float(forget_after))
    static = resources.files("hurtle.dashboard") / "static"
    app = Starlette(
        routes=[
            Route("/", dash.page),
            *Login(access).routes(),
            Route("/favicon.ico", dash.favicon),
            Route("/metrics", dash.metrics),
            Route("/api/", dash.api_index),
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
        ],
        exception_handlers={
            BrokerError: _broker_failed,
            ConfigurationError: _refused,
            BadRequest: _refused,
        },
    )
    app.add_middleware(_EnqueueLane, dashboard=dash)
    app.add_middleware(
        BodyLimit,
        caps=[
            (r"/login", LOGIN_BODY),
            (r"/api/queues/[^/]+/dead/(retry|delete)", IDS_BODY),
            (r"/api/queues/[^/]+/messages", MAX_BODY),
        ],
        budget=BodyBudget() if body_budget is None else BodyBudget(body_budget),
    )
    app.add_middleware(Guard, access=access)  # added last: runs first
    app.state.dashboard = dash
    return app


def _json(doc: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(doc, status_code=status)


def _error(status: int, text: str) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status)


async def _broker_failed(request: Request, err: Exception) -> Response:
    """Any API call the broker fails answers 503 with the broker's words, not a bare 500."""
    return _error(503, f"the broker failed: {err}")


async def _refused(request: Request, err: Exception) -> Response:
    """A request body the API refuses (``BadRequest``), or a value the broker refuses (a queue
    name it cannot take, say), answers 400 and why."""
    return _error(400, str(err))


async def _body(request: Request) -> Any:
    return decode_json(await request.body())


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
        try:
            body = await read_body(receive, MAX_BODY)
        except BodyTooLarge as err:
            await send_json_body(send, 413, _encode_json({"error": str(err)}))
            return
        if body is not None:
            status, answer = await self.dashboard.enqueue_body(queue, body)
            await send_json_body(send, status, answer)


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


class _Dashboard:
    def __init__(
        self,
        broker: Broker,
        declared: list[str],
        access: Access,
        sample_every: float,
        batch_window: float,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.broker = broker
        self.reads = Reads(read_timeout)
        self.declared = declared
        self.access = access
        self.sample_every = sample_every
        self.rates = queries.Throughput(broker, every=sample_every)
        self.batcher = Batcher(broker, window=batch_window)
        self.enqueuer = Enqueuer(None, True)
        #: Task names shown as they are (the app's); queues forgotten when idle.
        self.known: Collection[str] = frozenset()
        self.idle = IdleQueues(broker, declared, 0)
        self._registry: Any = None
        #: The app, when the dashboard was made from one: its schedules, which tasks keep results.
        self.app: Hurtle | None = None

    @property
    def keyring(self) -> Keyring | None:
        """What opens sealed arguments and results to show them: the app's keys, if it has
        some; else they are shown sealed (``sealed (key 3f2a9c01)``)."""
        return self.app.keyring if self.app is not None else None

    async def _run(self, fn: Any, *args: Any) -> Any:
        """A write to the broker, on a thread (unbounded: see ``reads.py``)."""
        return await anyio.to_thread.run_sync(fn, *args)

    async def _read(self, fn: Any, *args: Any) -> Any:
        """A read of the broker: 503 if it takes more than ``read_timeout`` seconds."""
        return await self.reads.run(fn, *args)

    # -- pages ------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        html = (resources.files("hurtle.dashboard") / "static" / "index.html").read_text()
        response = HTMLResponse(html.replace("{{root}}", request.scope.get("root_path", "")))
        set_csrf_cookie(response, request, self.access)
        return response

    async def favicon(self, request: Request) -> Response:
        icon = (resources.files("hurtle.dashboard") / "static" / "favicon.svg").read_bytes()
        return Response(icon, media_type="image/svg+xml")

    async def api_index(self, request: Request) -> Response:
        """``/api/``: the API's description."""
        return RedirectResponse(f"{request.scope.get('root_path', '')}/api/openapi.json")

    # -- reading ----------------------------------------------------------------------------

    async def openapi(self, request: Request) -> Response:
        return _json(OPENAPI)

    async def overview(self, request: Request) -> Response:
        return _json(
            await self._read(queries.overview, self.broker, self.rates, self.declared, self.idle)
        )

    async def throughput(self, request: Request) -> Response:
        await self._read(self.rates.sample)
        return _json({"every": self.sample_every, "points": list(self.rates.history)})

    async def stream(self, request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            while True:
                point, _ = await self._read(self.rates.sample)
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
        stats = await self._read(queries.queue_stats, self.broker, self.declared, self.idle)
        return _json(queries.queue_rows(stats))

    async def tasks(self, request: Request) -> Response:
        totals = await self._read(self.broker.totals)
        return _json(queries.count_rows(fold_counts(totals, self.known)))

    async def task(self, request: Request) -> Response:
        message_id = request.path_params["id"]
        if not message_id or len(message_id) > 200:
            return _error(400, "a message id is 1 to 200 characters")
        keeps = (
            {name: t.store_result for name, t in self.app.tasks.items()}
            if self.app is not None
            else None
        )
        row = await self._read(queries.task_lookup, self.broker, message_id, keeps, self.keyring)
        return _json(row)

    async def schedules(self, request: Request) -> Response:
        if self.app is None:
            return _json({"time": time.time(), "known": False, "schedules": []})
        rows = await self._read(queries.schedule_rows, self.app)
        return _json({"time": time.time(), "known": True, "schedules": rows})

    async def delayed(self, request: Request) -> Response:
        return _json(await self._read(queries.delayed_rows, self.broker, self.declared))

    async def workers(self, request: Request) -> Response:
        _, reports = await self._read(self.rates.sample)
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
        dead = await self._read(self.broker.dead_letters, queue, limit, offset)
        return _json([queries.dead_letter_row(d, self.keyring) for d in dead])

    # -- changing ---------------------------------------------------------------------------

    async def enqueue(self, request: Request) -> Response:
        status, body = await self.enqueue_body(request.path_params["queue"], await request.body())
        return Response(body, status_code=status, media_type="application/json")

    async def enqueue_body(self, queue: str, raw: bytes) -> tuple[int, bytes]:
        """Enqueue what a request body holds: (status, JSON answer)."""
        if (problem := queue_name_problem(queue)) is not None:
            return 400, _encode_json({"error": f"{problem}; {QUEUE_NAME_RULE}"})
        try:
            doc = decode_json(raw)
            messages = self.enqueuer.messages(queue, doc)
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
        return await self._set_paused(request, True)

    async def resume(self, request: Request) -> Response:
        return await self._set_paused(request, False)

    async def _set_paused(self, request: Request, paused: bool) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        queue = request.path_params["queue"]
        await self._run(self.broker.pause if paused else self.broker.resume, queue)
        return _json({"queue": queue, "paused": paused})

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
        ids = _ids_or_all(await _body(request))
        n = await self._run(self.broker.retry_dead, request.path_params["queue"], ids)
        return _json({"retried": n})

    async def delete_dead(self, request: Request) -> Response:
        if (bad := _bad_queue(request)) is not None:
            return bad
        ids = _ids_or_all(await _body(request))
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

            self._registry = registry(self.broker, self.declared, self.known, self.idle)
        body, content_type = await self._read(render, self._registry)
        return Response(body, media_type=content_type)
