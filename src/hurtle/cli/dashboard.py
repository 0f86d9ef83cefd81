"""``hurtle dashboard APP``: serve the dashboard, its JSON API and ``/metrics`` with uvicorn.

Listens on 127.0.0.1 unless ``--host`` says otherwise; any other address needs an access token
in ``HURTLE_DASHBOARD_TOKEN`` (``hurtle/dashboard/security.py``). uvicorn's own reading of proxy
headers is off: ``--trust-proxy`` (or ``HURTLE_DASHBOARD_TRUST_PROXY=1``) is the one switch.
The HTTP enqueue takes the app's task names only, unless ``--allow-unknown-tasks``
(``hurtle/dashboard/enqueue.py``). It serves an existing SQLite file only, and names it: one
started from the wrong directory says the file does not exist (``_app.open_broker``) instead of
showing the zeros of a new one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..dashboard.names import FORGET_AFTER
from ._app import add_seconds, app_command, describe, load_app, open_broker


def add_parser(sub: Any) -> None:
    p = app_command(sub, "dashboard", run, help="serve the web dashboard, JSON API and /metrics")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; any other needs HURTLE_DASHBOARD_TOKEN)",
    )
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument(
        "--trust-proxy",
        action="store_true",
        default=None,
        help="take the client's address and HTTPS from X-Forwarded-For and X-Forwarded-Proto: "
        "only when every request comes through your reverse proxy "
        "(or HURTLE_DASHBOARD_TRUST_PROXY=1)",
    )
    p.add_argument(
        "--allow-unknown-tasks",
        action="store_true",
        help="let POST /api/queues/Q/messages enqueue task names the app does not register "
        "(tasks of another program's workers); by default they are refused with 400",
    )
    add_seconds(
        p,
        "--forget-after",
        FORGET_AFTER,
        f"forget queues empty and unused for S seconds (default {FORGET_AFTER:g}; 0: never)",
    )


def run(args: argparse.Namespace) -> int:
    from ..dashboard.security import check_listen, from_environment

    token, trust_proxy = from_environment()
    check_listen(args.host, token)
    import uvicorn

    from ..dashboard import create_app

    app = load_app(args.app)
    broker = open_broker(app)
    where = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"hurtle dashboard for {describe(broker)} on http://{where}:{args.port}/"
        + (" (access token required)" if token else ""),
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        create_app(
            app,
            token=token or "",
            trust_proxy=args.trust_proxy or trust_proxy,
            allow_unknown_tasks=args.allow_unknown_tasks,
            forget_after=args.forget_after,
        ),
        host=args.host,
        port=args.port,
        proxy_headers=False,
        log_level="warning",
        access_log=False,
    )
    return 0
