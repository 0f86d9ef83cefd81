"""``hurtle outbox relay APP``: move APP's outbox to its broker until SIGTERM/SIGINT.

Every worker of an app with an outbox relays already (one at a time); this runs a relay on its
own, for a deployment where no worker runs beside the producers, or to relay from a host of its
own. It is one more candidate for the relay's lock: running it beside workers is safe (one of
them moves the outbox at a time, and each message is published once). ``count`` prints how many
messages wait in the outbox, and those the relay kept back as too large for the broker.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from ..errors import ConfigurationError
from ._app import load_app

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "outbox",
        help="the outbox of sends made in a transaction (outbox=)",
        description="relay: move APP's outbox (outbox=) to its broker until stopped, one relay "
        "at a time however many run; count: how many messages wait in it.",
    )
    p.add_argument("action", choices=["relay", "count"], help="relay, or count what waits")
    p.add_argument("app", help="the app, as module:attribute")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between looks at the outbox without a notification, and between tries "
        "at the relay's lock while another relay works (default 1)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..brokers.postgres.relay import Relay

    app = load_app(args.app)
    table = app.outbox
    if table is None:
        raise ConfigurationError(
            f"{args.app} has no outbox: give it one, Hurtle(..., "
            "outbox='postgresql://user@host/yourdb') or HURTLE_OUTBOX"
        )
    if not args.poll_interval > 0:
        raise ConfigurationError(f"--poll-interval must be > 0, got {args.poll_interval}")
    conn = table.connect()  # one line and exit 2 when the database cannot be used
    if args.action == "count":
        row = conn.execute(table.COUNT).fetchone()
        dead = conn.execute(table.DEAD_COUNT).fetchone()
        print(
            f"{row[0] if row else 0} messages wait in the outbox {table.schema}.outbox of "
            f"{table.url}"
        )
        if dead and dead[0]:
            print(
                f"{dead[0]} messages were too large for {app.settings.broker_url} and are "
                f"kept, never published, in {table.schema}.outbox_dead:"
            )
            for id_, queue, reason, _ in conn.execute(table.DEAD, (20,)):
                print(f"  {id_} ({queue}): {reason}")
        conn.close()
        return 0
    conn.close()
    broker = app.connect()
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    relay = Relay(table, broker, poll_interval=args.poll_interval)
    print(f"relaying the outbox {table.schema}.outbox of {table.url} to {broker.url}", flush=True)
    relay.run(stop)
    app.close()
    print(f"stopped: {relay.relayed} messages relayed", flush=True)
    return 0
