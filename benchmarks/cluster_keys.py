"""What ``MONITOR`` on a Redis Cluster's masters says about hurtle's commands: which keys each
named (a queue's, results, the keys outside queues), which script or command, sent by which
connection; and the table ``cluster_spread.py`` prints from it."""

from __future__ import annotations

import collections
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from hurtle.brokers.keys import (
    DEAD_INDEX,
    QUEUES,
    RESULT_KEY_PREFIX,
    RESULTS_CHANNEL,
    TOTALS,
    WORKER_DEADLINES,
    WORKER_REPORT,
)
from hurtle.brokers.redis import _get_scripts

#: Keys outside any queue, by what they hold.
GLOBAL_KEYS = {
    QUEUES: "known queues",
    WORKER_DEADLINES: "worker deadlines",
    TOTALS: "totals",
    DEAD_INDEX: "dead-letter index",
    RESULTS_CHANNEL: "results channel",
}
SCRIPTS = {s.sha: s.name for s in _get_scripts().all()}


def key_label(key: str | None, queues: list[str]) -> str:
    """What kind of key ``key`` is: a queue's, a results bucket, one of the global keys."""
    if key is None:
        return "no key: connections, cluster map"
    if key.startswith("hurtle:{"):
        tag = key[8 : key.find("}")]
        return "the queue's keys" if tag in queues else f"{{{tag}}}"
    if key.startswith(RESULT_KEY_PREFIX):
        return "results buckets"
    if key.startswith(WORKER_REPORT):
        return "worker reports"
    return GLOBAL_KEYS.get(key, key)


@dataclass
class Seen:
    """What ``MONITOR`` showed on one master: per (key kind, command or script), the calls
    clients sent; per key kind, the calls scripts made; per connection, what it sent."""

    sent: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    inside: collections.Counter[str] = field(default_factory=collections.Counter)
    by_conn: dict[str, collections.Counter[tuple[str, str]]] = field(default_factory=dict)

    def add(self, line: bytes, queues: list[str], skip: set[str]) -> None:
        """Count one line of ``MONITOR``, unless a connection in ``skip`` sent it."""
        source = _SOURCE.search(line)
        tokens = [t.group(1).decode("latin-1") for t in itertools.islice(_TOKEN.finditer(line), 4)]
        if source is None or not tokens or source.group(1).decode() in skip:
            return
        cmd = tokens[0].lower()
        if cmd in ("monitor", "info", "cluster", "client", "flushall", "command", "hello", "ping"):
            key = None
        elif cmd in ("evalsha", "eval"):
            key = tokens[3] if len(tokens) > 3 and tokens[2] != "0" else None
            cmd = SCRIPTS[tokens[1]] + ".lua" if tokens[1] in SCRIPTS else cmd
        else:
            key = tokens[1] if len(tokens) > 1 else None
        label = key_label(key, queues)
        if source.group(1) == b"lua":
            self.inside[label] += 1
            return
        if key is None:
            cmd = "(all)"
        self.sent[label, cmd] += 1
        conn = source.group(1).decode()
        self.by_conn.setdefault(conn, collections.Counter())[label, cmd] += 1


_TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_SOURCE = re.compile(rb"\[\d+ ([^\]]+)\]")


def print_monitored(
    m: int, masters: list[Any], seen: dict[int, Seen], many: Any, batch: int
) -> None:
    """Calls per publish batch (``batch`` tasks), by key kind and command, on each master;
    for plain commands, what one call took in the timed run (every call of that command on
    that master, inside scripts too)."""
    print(
        f"\nCommands sent to each master by key, per {batch:,} tasks (one publish batch): "
        f"MONITOR, {m:,} tasks; (µs per call of that command on that master)\n"
    )
    print("| keys | command | " + " | ".join(nd.label for nd in masters) + " |")
    print("| --- | --- |" + " ---: |" * len(masters))

    def cell(nd: Any, calls: int, cmd: str) -> str:
        if not calls:
            return ""
        spent = (many.publish[nd.port] + many.consume[nd.port]).commands.get(cmd)
        each = f" ({spent[1] / spent[0]:.1f})" if spent else ""
        return f"{calls * batch / m:.1f}{each}"

    for label, cmd in sorted({k for nd in masters for k in seen[nd.port].sent}):
        cells = [cell(nd, seen[nd.port].sent[label, cmd], cmd) for nd in masters]
        print(f"| {label} | {cmd} | " + " | ".join(cells) + " |")
    for label in sorted({k for nd in masters for k in seen[nd.port].inside}):
        if label != "the queue's keys" and not label.startswith("no key"):
            cells = [cell(nd, seen[nd.port].inside[label], "") for nd in masters]
            print(f"| {label} | (by scripts) | " + " | ".join(cells) + " |")
    cells = []
    for nd in masters:
        conns = seen[nd.port].by_conn
        total = sum(sum(c.values()) for c in conns.values()) or 1
        busiest = max(conns.values(), key=lambda c: sum(c.values()), default=collections.Counter())
        what = ", ".join(f"{cmd}" for (_, cmd), _ in busiest.most_common(2))
        cells.append(f"{len(conns)}; busiest {sum(busiest.values()) / total:.0%} ({what})")
    print("| connections | sent by | " + " | ".join(cells) + " |")
