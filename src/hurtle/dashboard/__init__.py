"""hurtle's dashboard: pages, a JSON API and Prometheus metrics, in one ASGI app.

``hurtle dashboard tasks:app`` serves it (uvicorn, loopback by default); ``create_app(app)``
returns it to mount in an application of your own (Starlette, FastAPI). Needs the
``dashboard`` extra: ``pip install "hurtle[dashboard]"``. ``queries`` (read-only views shared
with ``hurtle status``) needs nothing extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..app import Hurtle
    from ..brokers import Broker

__all__ = ["create_app"]


def create_app(target: Hurtle | Broker, **options: Any) -> Any:
    """The dashboard's ASGI app for ``target`` (see ``hurtle.dashboard.web.create_app``)."""
    from .web import create_app as make

    return make(target, **options)
