"""Connecting to NATS, and what the connection's troubles look like to hurtle.

``connect`` makes a client that keeps reconnecting for ever once it is connected (a worker
outlives a server restart), but fails once its first connection failed on every server the
URL lists (the first error, for a URL of one server), in one
``BrokerError`` with the reason and a hint, as the other brokers do: nats-py alone retries a
server that refuses every two seconds without end, and hands each failure to its error
callback, whose default logs a traceback. The callbacks given here say what happened in one
line on this module's logger: a lost connection and its first error as warnings, the rest of
an outage at debug level, the reconnection as info.

``broker_error`` turns what a nats-py call raised into the ``BrokerError`` a caller of a
broker sees, chained through a ``ConnectionError`` when the server cannot be reached now, so
that the worker keeps such outcomes for later instead of giving up on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from ..._text import describe, safe_str
from ...errors import BrokerError

log = logging.getLogger(__name__)

#: What nats-py raises when the server cannot be reached now (not when it refused a request).
UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.NoRespondersError,
    # a stream or JetStream itself without a leader for now (a cluster electing one)
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)

_HINT = "is nats-server running there, with JetStream on (nats-server -js)?"


def reason(err: BaseException) -> str:
    """The error's own text, or its type's name when it has none."""
    text = safe_str(err).strip()
    return text if text else describe(err).rstrip(": ")


def hint(err: BaseException, tls: bool = False) -> str:
    """What to check after ``err`` (on a connection that asked for TLS, if ``tls``)."""
    if isinstance(err, nats.errors.AuthorizationError) or "authorization" in reason(err).lower():
        return "check the user and password, creds or nkey in the broker URL"
    if isinstance(err, ssl.SSLCertVerificationError):
        return "check tls_ca in the broker URL: the CA that signed the server's certificate"
    closed = isinstance(err, UNREACHABLE) and not isinstance(err, ConnectionRefusedError)
    if isinstance(err, ssl.SSLError) or (tls and closed):
        # (a server that refuses a client's certificate may just close the connection)
        return (
            "check the TLS options of the broker URL: tls_ca, and tls_cert and tls_key (a "
            "client certificate signed by a CA the server trusts) when it verifies clients"
        )
    if isinstance(
        err, (nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)
    ):
        return (
            "a cluster electing a leader answers again within seconds; are most of its servers up?"
        )
    if isinstance(err, nats.errors.NoRespondersError):
        return "is JetStream on there (nats-server -js), and in a cluster, are most servers up?"
    return _HINT


def broker_error(err: BaseException, url: str = "") -> BrokerError:
    """The ``BrokerError`` for ``err``, raised by a call to NATS (at ``url``, if given)."""
    if isinstance(err, BrokerError):
        return err
    where = f"NATS at {url}" if url else "NATS"
    if isinstance(err, UNREACHABLE):
        out = BrokerError(f"cannot reach {where}: {reason(err)}; {hint(err)}")
        lost = ConnectionError(reason(err))
        lost.__cause__ = err
        out.__cause__ = lost
        return out
    out = BrokerError(f"{where} failed: {reason(err)}")
    out.__cause__ = err
    return out


async def connect(servers: list[str], url: str, **options: Any) -> Client:
    """A connected client, or the ``BrokerError`` of the first failure to connect."""
    first: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
    state = {"connected": False, "quiet": False}
    failed: list[BaseException] = []

    async def on_error(err: Exception) -> None:
        if not state["connected"]:
            failed.append(err)  # one error per server tried: fail once each was tried
            if len(failed) >= len(servers) and not first.done():
                first.set_result(failed[0])
        elif state["quiet"]:
            log.debug("NATS at %s: %s", url, reason(err))
        else:
            state["quiet"] = True  # the rest of this outage at debug level
            log.warning("NATS at %s: %s", url, reason(err))

    async def on_disconnected() -> None:
        if state["connected"] and not nc.is_closed:  # (closed: the broker was closed)
            log.warning("lost the connection to NATS at %s; reconnecting", url)

    async def on_reconnected() -> None:
        state["quiet"] = False
        log.info("reconnected to NATS at %s", url)

    async def on_closed() -> None:
        log.debug("the connection to NATS at %s is closed", url)

    nc = Client()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers=servers,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            closed_cb=on_closed,
            **options,
        )
    )
    await asyncio.wait((connecting, first), return_when=asyncio.FIRST_COMPLETED)
    if connecting.done() and connecting.exception() is None:
        state["connected"] = True
        return nc
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 5)
    err = first.result() if first.done() else connecting.exception()
    assert err is not None
    why = f"{reason(err)}; {hint(err, tls='tls' in options)}"
    raise BrokerError(f"cannot connect to NATS at {url}: {why}") from err
