"""The two ASGI apps ``hurtle bench http`` serves, each in a uvicorn process of its own:

* ``enqueue`` — the dashboard (``hurtle.dashboard.create_app``) on a Redis broker, made from an
  app that registers ``add(x, y)``, so each request's task name and arguments are checked; wrk
  posts ``{"task": "add", "args": [5, 6], "kwargs": {}}`` to ``/api/queues/bench/messages``;
* ``incr`` — a plain ASGI app doing Redis ``INCR`` then ``GET`` per request with
  ``redis.asyncio`` (a pool of at most ``POOL`` connections), answering the value as JSON.

Run as ``python -m hurtle.bench.http.apps APP REDIS_URL PORT``.
"""

from __future__ import annotations

import sys
from typing import Any

#: Most Redis connections the plain app opens (requests beyond wait for one).
POOL = 100


def incr_app(redis_url: str) -> Any:
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=POOL)
    client = aioredis.Redis(connection_pool=pool)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await client.incr("hits")
        value = await client.get("hits")
        body = b'{"hits": ' + (value if isinstance(value, bytes) else b"0") + b"}"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def enqueue_app(redis_url: str) -> Any:
    from ...app import Hurtle
    from ...dashboard import create_app

    app = Hurtle(redis_url)

    @app.task(name="add", queue="bench")
    def add(x: int, y: int) -> int:  # what the enqueue checks each request's name and arguments
        return x + y

    return create_app(app, token="")


def main(argv: list[str]) -> None:
    import uvicorn

    name, redis_url, port = argv
    app = {"incr": incr_app, "enqueue": enqueue_app}[name](redis_url)
    uvicorn.run(
        app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False, backlog=4096
    )


if __name__ == "__main__":
    main(sys.argv[1:])
