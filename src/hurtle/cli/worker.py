"""``hurtle worker APP``: run a worker until SIGTERM/SIGINT (or drained, with ``--burst``).

This is the launcher: for the gevent and eventlet pools it patches the standard library before
the user's module is imported, with ``--processes P`` it runs a supervisor of P fresh worker
processes instead of a worker (the supervisor imports no user code), and with ``--watch`` a
parent that restarts the worker (or its supervisor) when the code changes (``watch``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..names import check_queue_name
from ..worker.executors import POOLS
from ..worker.log import BURST, LINES_PER_SECOND, SUMMARY_EVERY
from ..worker.supervisor import EXIT_RECYCLE, Supervisor
from ._app import APP_HELP, app_command, load_app

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = {"solo": 1, "threads": 10, "asyncio": 100, "gevent": 100, "eventlet": 100}


def add_parser(sub: Any) -> None:
    p = app_command(
        sub,
        "worker",
        run,
        app_help=f"{APP_HELP} (e.g. tasks:app)",
        help="consume tasks",
        description="Run a worker for APP (module:attribute).",
    )
    p.add_argument(
        "--queues",
        "-Q",
        default="",
        help="comma-separated queues (default: every queue the app's tasks name)",
    )
    p.add_argument("--pool", "-P", default="solo", choices=POOLS, help="concurrency mode")
    p.add_argument(
        "--concurrency",
        "-c",
        default=None,
        metavar="N|MIN,MAX",
        help="tasks at once per process; MIN,MAX scales with the backlog (default: "
        "1 for solo, 10 for threads, 100 for asyncio, gevent and eventlet)",
    )
    p.add_argument(
        "--processes",
        "-p",
        type=int,
        default=None,
        help="run this many worker processes under a supervisor that restarts them",
    )
    p.add_argument(
        "--burst",
        action="store_true",
        help="exit 0 once the queues have nothing ready, delayed or in flight",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds running tasks get to finish on SIGTERM (default 30)",
    )
    p.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not enqueue the app's periodic tasks (other workers still do)",
    )
    p.add_argument(
        "--log-tasks",
        action="store_true",
        help="at INFO, log a line for every call, however many (default: a line per call "
        f"while they average at most {LINES_PER_SECOND:g} a second, in bursts of up to "
        f"{BURST}; beyond that, a summary every --log-interval seconds)",
    )
    p.add_argument(
        "--log-interval",
        type=_interval,
        default=SUMMARY_EVERY,
        metavar="S",
        help=f"seconds between summary lines under load (default {SUMMARY_EVERY:g})",
    )
    p.add_argument(
        "--watch",
        nargs="?",
        const=".",
        default=None,
        type=Path,
        metavar="PATH",
        help="development: restart the worker when a .py file under PATH (default: the "
        "current directory) changes; put it after APP or give PATH",
    )
    p.add_argument("--supervised-by", type=int, default=None, help=argparse.SUPPRESS)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _interval(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def parse_concurrency(text: str | None, pool: str) -> tuple[int, int | None]:
    """``"N"`` -> ``(N, None)``; ``"MIN,MAX"`` -> ``(MAX, MIN)``; ``None`` -> the pool default.

    The solo pool runs one task at a time whatever ``N`` says (the caller warns).
    """
    if text is None:
        return DEFAULT_CONCURRENCY[pool], None
    parts = [p.strip() for p in str(text).split(",")]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1 and numbers[0] >= 1:
        return (1 if pool == "solo" else numbers[0]), None
    if len(numbers) == 2 and 1 <= numbers[0] <= numbers[1]:
        if pool not in ("threads", "gevent", "eventlet"):
            raise ConfigurationError(
                f"--concurrency MIN,MAX ({text!r}) needs a pool that scales itself: threads, "
                "gevent or eventlet"
            )
        return numbers[1], numbers[0]
    raise ConfigurationError(
        f"--concurrency must be a number >= 1 or MIN,MAX with 1 <= MIN <= MAX, got {text!r}"
    )


def run(args: argparse.Namespace) -> int:
    concurrency, min_concurrency = parse_concurrency(args.concurrency, args.pool)
    queues = [check_queue_name(q.strip()) for q in args.queues.split(",") if q.strip()] or None
    if args.watch is not None:  # the worker (or supervisor) runs in a child: it warns
        from .watch import Reloader

        command = worker_argv(args)
        if args.processes is not None:
            command += ["--processes", str(args.processes)]
        reloader = Reloader(command, args.watch)
        reloader.install_signal_handlers()
        return reloader.run()
    ignored = args.pool == "solo" and args.concurrency is not None and int(args.concurrency) > 1
    if ignored and args.supervised_by is None:  # the supervisor warned: not once per child
        log.warning(
            "--concurrency %s is ignored: the solo pool runs one task at a time; use "
            "--pool threads (or asyncio, gevent, eventlet) to run several at once, or "
            "--processes %s for that many solo processes",
            args.concurrency,
            args.concurrency,
        )
    if args.processes is not None:
        return _supervise(args)
    from ..worker.executors.greenlets import patch

    patch(args.pool)  # before the user's module is imported: a no-op but for greenlet pools
    app = load_app(args.app)
    worker = app.worker(
        queues=queues,
        pool=args.pool,
        concurrency=concurrency,
        min_concurrency=min_concurrency,
        burst=args.burst,
        shutdown_timeout=args.shutdown_timeout,
        recycle_abandoned=args.supervised_by is not None,
        parent_pid=args.supervised_by,
        scheduler=not args.no_scheduler,
        log_tasks=args.log_tasks,
        log_interval=args.log_interval,
    )
    broker = app.broker  # connect now, so a bad URL fails before anything starts
    where = getattr(broker, "path", None)  # a file broker: say which file, wherever we run
    log.info(
        "app %s: %d tasks (%s); broker %s",
        args.app,
        len(app.tasks),
        ", ".join(sorted(app.tasks)) or "none",
        f"file {Path(where).resolve()}" if where is not None else broker.url,
    )
    worker.install_signal_handlers()
    # This process is the worker's own: what the app's import made lives as long as it does.
    # Frozen, it is no longer walked by every full collection, which a batch's objects (kept
    # until the batch ends) would otherwise trigger every few batches.
    gc.collect()
    gc.freeze()
    worker.run()
    return EXIT_RECYCLE if worker.recycle else 0


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The ``hurtle`` arguments of this worker command for a child process, but for
    ``--watch`` and ``--processes``, which the parent that starts it handles."""
    command = ["--log-level", str(args.log_level), "--log-format", args.log_format]
    if args.log_config is not None:
        command += ["--log-config", str(args.log_config.resolve())]
    command += ["worker", args.app, "--pool", args.pool]
    if args.queues:
        command += ["--queues", args.queues]
    if args.concurrency is not None:
        command += ["--concurrency", str(args.concurrency)]
    if args.burst:
        command.append("--burst")
    if args.no_scheduler:
        command.append("--no-scheduler")
    if args.shutdown_timeout is not None:
        command += ["--shutdown-timeout", str(args.shutdown_timeout)]
    if args.log_tasks:
        command.append("--log-tasks")
    command += ["--log-interval", str(args.log_interval)]
    return command


def _supervise(args: argparse.Namespace) -> int:
    if args.processes < 1:
        raise ConfigurationError(f"--processes must be at least 1, got {args.processes}")
    command = [*worker_argv(args), "--supervised-by", str(os.getpid())]
    supervisor = Supervisor(command, args.processes, burst=args.burst)
    supervisor.install_signal_handlers()
    return supervisor.run()
