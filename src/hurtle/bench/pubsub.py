"""``hurtle bench pubsub``: seed 003's pub/sub benchmark, hurtle's channels against raw clients.

C publisher/subscriber pairs (C in 1, 2, 4 by default), 50 channels, 20-byte payloads, a fixed
duration. Every publisher sends to channels picked at random as fast as it can; every subscriber
listens to all the channels, so each should receive everything every publisher sent. Reported
per row: the median messages/s per subscriber (over every subscriber's one-second samples of the
measured window, as seed 003 did), what publishers sent, the share that subscribers received
(``delivered``), the losses each system *reported* (only hurtle counts them; the others drop
silently) and what is left ``unaccounted`` (neither received nor reported lost:
silent loss). Publishers and subscribers are processes, not threads; the broker (redis-server,
the zmq proxy, nats-server) is one more process, all on the same cores.

Rows: ``hurtle-buffered`` (channels with their default buffer: 1,000 messages or 5 ms),
``hurtle-buffer0`` (``buffer=0``: one frame per publish), ``redis-publish`` (redis-py, one
``PUBLISH`` per message), ``redis-pipelined`` (a pipeline sent at 1,000 commands or every
200 ms), ``zmq-proxy`` (pyzmq PUSH → ``zmq.proxy`` PULL→PUB → SUB; skipped without pyzmq) and
``nats`` (core NATS via nats-py; skipped without nats-py or a ``nats-server`` on PATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import multiprocessing
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .pubsub_clients import Setup, publisher, subscriber, zmq_proxy

ROWS = (
    "hurtle-buffered",
    "hurtle-buffer0",
    "redis-publish",
    "redis-pipelined",
    "zmq-proxy",
    "nats",
)


@dataclasses.dataclass
class PubSubRow:
    name: str
    pairs: int
    median_rate: float = 0.0
    sent: int = 0
    received: int = 0
    lost_reported: int | None = None
    reconnects: int = 0
    seconds: float = 0.0
    skipped: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def unaccounted(self) -> int:
        """Messages neither received nor reported lost by any subscriber."""
        return max(self.sent * self.pairs - self.received - (self.lost_reported or 0), 0)

    @property
    def delivered(self) -> float:
        """Share of what every subscriber should have received that it did receive."""
        expected = self.sent * self.pairs
        return self.received / expected if expected else 0.0


def add_parser(kinds: Any) -> None:
    pubsub: argparse.ArgumentParser = kinds.add_parser(
        "pubsub",
        help="channels against raw Redis pub/sub, a zmq proxy and NATS; msgs/s",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    pubsub.add_argument(
        "--pairs",
        default="1,2,4",
        help="comma-separated publisher/subscriber pair counts (default 1,2,4)",
    )
    pubsub.add_argument(
        "--duration", type=float, default=5.0, help="seconds each row publishes (default 5)"
    )
    pubsub.add_argument("--channels", type=int, default=50, help="channels (default 50)")
    pubsub.add_argument("--size", type=int, default=20, help="payload bytes (default 20)")
    pubsub.add_argument("--only", default="", help="comma-separated rows (default: all)")
    pubsub.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    pubsub.add_argument("--json", type=Path, default=None, help="write rows and machine here")
    pubsub.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")
    pubsub.set_defaults(handler=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Nats:
    """A private ``nats-server`` on a free port."""

    def __init__(self, binary: str) -> None:
        self.port = _free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ConfigurationError(f"nats-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _skip_reason(name: str) -> str:
    if name == "zmq-proxy" and importlib.util.find_spec("zmq") is None:
        return "pyzmq is not installed: pip install -e '.[bench]'"
    if name == "nats":
        if importlib.util.find_spec("nats") is None:
            return "nats-py is not installed: pip install -e '.[bench]'"
        if shutil.which("nats-server") is None:
            return "nats-server is not on PATH"
    return ""


def run_row(name: str, pairs: int, setup: Setup) -> PubSubRow:
    """One row: start C subscribers and C publishers, wait until all are ready, measure."""
    row = PubSubRow(name, pairs, seconds=setup.duration)
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, start = ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=subscriber, args=(setup, ready, go, start, results))
        for _ in range(pairs)
    ]
    procs += [
        ctx.Process(target=publisher, args=(setup, ready, go, start, results)) for _ in range(pairs)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    try:
        for _ in procs:
            ready.get(timeout=60)
        start.value = time.time() + 0.2
        go.set()
        deadline = time.monotonic() + setup.duration + 120
        while len(reports) < len(procs) and time.monotonic() < deadline:
            try:
                reports.append(results.get(timeout=1))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    subs = [r for r in reports if r["role"] == "subscriber"]
    pubs = [r for r in reports if r["role"] == "publisher"]
    if len(subs) < pairs or len(pubs) < pairs:
        row.notes.append(f"only {len(subs)} subscriber and {len(pubs)} publisher reports came back")
    samples = [n for r in subs for n in r["per_second"]]
    row.median_rate = float(statistics.median(samples)) if samples else 0.0
    row.sent = sum(r["sent"] for r in pubs)
    row.received = sum(r["received"] for r in subs)
    lost = [r["lost"] for r in subs]
    row.lost_reported = None if any(n is None for n in lost) else sum(lost)
    row.reconnects = sum(r["reconnects"] for r in subs)
    errors = sorted({r["error"] for r in pubs if r.get("error")})
    if errors:
        row.notes.append("publisher errors at the end: " + "; ".join(errors))
    slow = sum(r.get("slow_consumer_errors", 0) for r in subs)
    if slow:
        row.notes.append(f"{slow} slow-consumer errors")
    return row


def _setup(
    name: str, redis_url: str, args: argparse.Namespace, zmq_ports: tuple[int, int], nats_url: str
) -> Setup:
    return Setup(
        system=name,
        redis_url=redis_url,
        channels=tuple(f"ch{i:03d}" for i in range(args.channels)),
        payload_size=args.size,
        duration=args.duration,
        zmq_in=f"tcp://127.0.0.1:{zmq_ports[0]}",
        zmq_out=f"tcp://127.0.0.1:{zmq_ports[1]}",
        nats_url=nats_url,
    )


def _line(row: PubSubRow) -> str:
    if row.skipped:
        return f"{row.name:<17} C={row.pairs}  skipped: {row.skipped}"
    lost = "-" if row.lost_reported is None else f"{row.lost_reported:,}"
    notes = f"  [{'; '.join(row.notes)}]" if row.notes else ""
    return (
        f"{row.name:<17} C={row.pairs}  {row.median_rate:>11,.0f} msgs/s per subscriber  "
        f"delivered {row.delivered:6.1%}  sent {row.sent:>11,}  reported lost {lost:>11}  "
        f"unaccounted {row.unaccounted:>11,}  reconnects {row.reconnects}{notes}"
    )


def table(rows: list[PubSubRow]) -> str:
    return "\n".join(_line(r) for r in rows)


def ratios(rows: list[PubSubRow]) -> list[str]:
    """The issue's targets, from this run: hurtle buffered against zmq at C=1 and Redis rows."""

    def rate(name: str, pairs: int) -> float | None:
        for r in rows:
            if r.name == name and r.pairs == pairs and not r.skipped and r.median_rate:
                return r.median_rate
        return None

    lines = []
    for pairs in sorted({r.pairs for r in rows}):
        mine = rate("hurtle-buffered", pairs)
        if mine is None:
            continue
        for other, target in (
            ("zmq-proxy", 1.0 if pairs == 1 else None),
            ("redis-publish", 1.0),
            ("redis-pipelined", 1.0),
        ):
            theirs = rate(other, pairs)
            if theirs is None:
                continue
            value = mine / theirs
            verdict = "" if target is None else ("met" if value >= target else "MISSED")
            goal = f"target >= {target:g}x" if target is not None else "for information"
            lines.append(
                f"C={pairs} hurtle-buffered / {other:<16} {value:8.2f}x  {goal:<16} {verdict}"
            )
    return lines


def plot(rows: list[PubSubRow], path: Path, title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: pip install -e '.[bench]'"
    measured = [r for r in rows if not r.skipped and r.median_rate]
    if not measured:
        return "no row was measured"
    names = list(dict.fromkeys(r.name for r in measured))
    pairs = sorted({r.pairs for r in measured})
    width = 0.8 / len(pairs)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=90)
    for k, c in enumerate(pairs):
        values = [
            next((r.median_rate for r in measured if r.name == n and r.pairs == c), 0.0)
            for n in names
        ]
        xs = [i + k * width for i in range(len(names))]
        ax.bar(xs, values, width, label=f"C={c}")
    ax.set_xticks([i + width * (len(pairs) - 1) / 2 for i in range(len(names))], names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median msgs/s per subscriber (log)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def run(args: argparse.Namespace) -> int:
    from . import machine
    from .redis_server import RedisServer

    try:
        pair_counts = [int(p) for p in args.pairs.split(",") if p.strip()]
    except ValueError as err:
        raise ConfigurationError(f"--pairs {args.pairs!r}: give numbers like 1,2,4") from err
    if not pair_counts or min(pair_counts) < 1 or args.duration < 1 or args.channels < 1:
        raise ConfigurationError("--pairs must be >= 1, --duration >= 1 s, --channels >= 1")
    wanted = [n.strip() for n in args.only.split(",") if n.strip()] or list(ROWS)
    unknown = [n for n in wanted if n not in ROWS]
    if unknown:
        raise ConfigurationError(
            f"unknown row(s) {', '.join(unknown)}: choose from {', '.join(ROWS)}"
        )
    server = None if args.redis_url else RedisServer()
    url = args.redis_url or (server.url if server else "")
    rows: list[PubSubRow] = []
    try:
        info = machine.describe(url)
        for name in wanted:
            skip = _skip_reason(name)
            for pairs in pair_counts:
                print(f"-- {name} C={pairs}", file=sys.stderr, flush=True)
                if skip:
                    rows.append(PubSubRow(name, pairs, skipped=skip))
                    continue
                rows.append(_run_with_broker(name, pairs, url, args))
    finally:
        if server is not None:
            server.stop()
    print(
        f"hurtle bench pubsub: {args.channels} channels, {args.size}-byte payloads, "
        f"{args.duration:g} s per row, C publisher + C subscriber processes; {info['cpu']}, "
        f"{info['cores']} cores, {info['memory_gib']} GiB, Python {info['python']}, Redis "
        f"{info['redis']}, {info['date']}"
    )
    print(table(rows))
    lines = ratios(rows)
    if lines:
        print("\nratios (same run, median msgs/s per subscriber):")
        for line in lines:
            print("  " + line)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "hurtle bench pubsub",
                    "machine": info,
                    "channels": args.channels,
                    "payload_bytes": args.size,
                    "duration": args.duration,
                    "rows": [
                        dataclasses.asdict(r)
                        | {"delivered": r.delivered, "unaccounted": r.unaccounted}
                        for r in rows
                    ],
                    "ratios": lines,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"\nwrote {args.json}")
    if args.plot:
        why: str | None = plot(
            rows,
            args.plot,
            f"hurtle bench pubsub: {args.channels} channels, {args.size} B, {info['cores']} cores",
        )
        print(f"plot: {why}" if why else f"wrote {args.plot}")
    return 0 if all(r.skipped or r.received for r in rows) else 1


def _run_with_broker(name: str, pairs: int, redis_url: str, args: argparse.Namespace) -> PubSubRow:
    """Starts the row's own broker where it has one (zmq proxy, nats-server), then the row."""
    ports = (_free_port(), _free_port())
    if name == "zmq-proxy":
        setup = _setup(name, redis_url, args, ports, "")
        proxy = multiprocessing.get_context("spawn").Process(
            target=zmq_proxy,
            args=(f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"),
            daemon=True,
        )
        proxy.start()
        try:
            return run_row(name, pairs, setup)
        finally:
            proxy.kill()
            proxy.join()
    if name == "nats":
        nats = _Nats(shutil.which("nats-server") or "nats-server")
        try:
            return run_row(name, pairs, _setup(name, redis_url, args, ports, nats.url))
        finally:
            nats.stop()
    return run_row(name, pairs, _setup(name, redis_url, args, ports, ""))
