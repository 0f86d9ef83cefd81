"""``hurtle db upgrade APP``: bring the app's PostgreSQL schema to the version of this hurtle.

A PostgreSQL broker makes its schema on first use, and refuses one older or newer than the code
(a worker says so when it starts). This command makes the schema if it is missing, or applies
the upgrades from its version to this hurtle's in one transaction (stop the workers first).
Other brokers have no schema to upgrade: a SQLite file upgrades itself when opened, and the
command says so.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from ._app import app_command, load_app


def add_parser(sub: Any) -> None:
    app_command(
        sub,
        "db",
        run,
        actions=["upgrade"],
        action_help="upgrade: make or upgrade the schema",
        action_first=True,
        help="the broker's database schema",
        description="The schema of APP's PostgreSQL broker: upgrade makes it, or brings it to "
        "this hurtle's version (stop the workers first).",
    )


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    url = app.settings.broker_url
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme not in ("postgresql", "postgres"):
        print(
            f"nothing to upgrade: the broker {url.split('?')[0]!r} has no schema of its own "
            "(a SQLite file upgrades itself when opened)"
        )
        return 0
    from ..brokers.postgres import upgrade_schema
    from ..brokers.postgres.connection import parse_url, public_url

    schema = parse_url(url)[1]
    before, after = upgrade_schema(url)
    where = f"schema {schema!r} of {public_url(url)}"
    if before is None:
        print(f"made the hurtle {where} at version {after}")
    elif before == after:
        print(f"the hurtle {where} is at version {after}, this hurtle's: nothing to do")
    else:
        print(f"upgraded the hurtle {where} from version {before} to {after}")
    return 0
