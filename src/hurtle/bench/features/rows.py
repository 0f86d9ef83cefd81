"""The rows of ``hurtle bench features``: one ``Feature`` each, the task options it registers
``bench.add`` with and the worker options it runs with. ``bare`` (no option) is the baseline every
other row is compared with. A row whose option this hurtle does not have is skipped by itself."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from typing import Any

from ...app import Hurtle
from ...errors import ConfigurationError
from ..harness.scenario import Scenario, hurtle_worker, publisher

#: A rate that never binds at bench speed, and a uniqueness window longer than any run.
_RATE = "10000000/s"
_UNIQUE = 3600
#: A debounce window shorter than the publish of a row: its calls are due when the worker starts.
_DEBOUNCE = 0.001
#: The key of the ``encrypt`` row, new for each run.
_KEY = base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    #: Task options ``bench.add`` is registered with (``$HURTLE_BENCH_OPTIONS``).
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``hurtle worker`` options; the solo pool when empty.
    worker: tuple[str, ...] = ()
    #: App settings the publisher and the worker get (as ``HURTLE_*`` variables).
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: What each call does beside its work (``peers.features_app``): "" nothing, "progress" a
    #: ``hurtle.current().progress`` report.
    calls: str = ""
    #: The publisher (``module:function``): ``send_many`` straight to Redis unless another.
    publisher: str = "hurtle.bench.peers.features_app:publish"
    #: Per-call options the calls are sent with (``Task.options``), such as a ``delay``.
    send: dict[str, Any] = dataclasses.field(default_factory=dict)

    def unavailable(self) -> str | None:
        """Why a task cannot be registered with these options here, or None if it can."""
        if self.name == OUTBOX:
            return _outbox_missing()
        try:
            app = Hurtle("memory://", **self.settings)
            app.task(name="probe", **self.options)(lambda x, y: x + y)
        except (TypeError, ConfigurationError) as err:
            return f"option not available ({err})"
        return None

    def scenario(self) -> Scenario:
        """The publish-then-consume row the harness runs, on ``peers.features_app``."""
        env = {
            "HURTLE_BENCH_OPTIONS": json.dumps(self.options),
            "HURTLE_BENCH_CALLS": self.calls,
            "HURTLE_BENCH_SEND": json.dumps(self.send),
        }
        for name, value in self.settings.items():
            text = ",".join(value) if isinstance(value, list | tuple) else str(value)
            env[f"HURTLE_{name.upper()}"] = text
        if "--pool" in self.worker:
            env["HURTLE_BENCH_PROBE_LOCK"] = "1"  # tasks count from several threads
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items()) or "no option"
        if self.calls == "progress":
            options += "; hurtle.current().progress() in every call"
        if self.send:
            sent = "sent with options(" + ", ".join(f"{k}={v!r}" for k, v in self.send.items())
            options = (f"{options}; " if self.options else "") + sent + ")"
        return Scenario(
            name=self.name,
            system="hurtle",
            guarantee="acknowledged",
            config=options + (f"; {' '.join(self.worker)}" if self.worker else "; solo"),
            publisher=publisher(self.publisher),
            worker=hurtle_worker("hurtle.bench.peers.features_app:app", *self.worker),
            env=env,
            modules=("redis",),
            version_of="hurtle",
        )


#: The row whose publish rate is what it is about (``x bare`` of publish/s in its notes).
OUTBOX = "outbox"


def _outbox_missing() -> str | None:
    """Why the ``outbox`` row cannot run here (no PostgreSQL of ``--outbox-url``), or None."""
    url = os.environ.get("HURTLE_BENCH_OUTBOX_URL", "")
    if not url:
        return "needs a PostgreSQL database: --outbox-url postgresql://user@host/database"
    try:
        import psycopg

        psycopg.connect(url.partition("?")[0], connect_timeout=5).close()
    except ImportError:
        return "needs psycopg: pip install 'hurtle[postgres]'"
    except psycopg.Error as err:
        return f"cannot reach --outbox-url: {' '.join(str(err).split())}"
    return None


BARE = Feature("bare")
ROWS = [
    BARE,
    Feature("store_result", {"store_result": True}),
    Feature("rate_limit", {"rate_limit": _RATE}),
    # an adaptive rate limit whose calls are never throttled (``hurtle.Throttle``, ``on_429``):
    # what adapting costs a task that never needs it, compared with rate_limit
    Feature("throttle", {"rate_limit": _RATE, "on_429": True}),
    Feature("unique_for", {"unique_for": _UNIQUE}),
    Feature("time_limit", {"time_limit": 10}),
    # each call its own key (``add(i, 6)`` keyed by ``x``), so none is superseded: what a
    # debounced call costs, its latest record written per batch sent and read per batch fetched;
    # a window short enough that every call is due by the time the worker starts
    Feature("debounce", {"debounce": _DEBOUNCE, "debounce_key": "x"}),
    # one fair key (``y`` is 6 in every call): what reading a queue by turns costs when one
    # tenant has all the work, its sub-queue listed every quarter second beside the queue
    Feature("fair_key", {"fair_key": "y"}),
    # what the debounce window's delay costs by itself: the calls wait in the delayed set and
    # each fetch moves them to the ready lists first
    Feature("delay", send={"delay": _DEBOUNCE}),
    # arguments opened in the worker, one AES-GCM per message
    Feature("encrypt", {"encrypt": True}, settings={"encryption_keys": [_KEY]}),
    Feature(
        "all",
        {"store_result": True, "rate_limit": _RATE, "unique_for": _UNIQUE, "time_limit": 10},
    ),
    # every call reports its progress: the worst case, a report per call of a trivial task
    Feature("progress", calls="progress"),
    # the calls sent as workflows of 100, a chord inside a chain: each member counted in its
    # chord with its acknowledgement, every header carrying what its result sets off
    Feature("nested", publisher="hurtle.bench.peers.features_app:publish_nested"),
    # the same calls as flat chords of 100: what any workflow costs, beside which the nested
    # row shows what nesting adds
    Feature("chord", publisher="hurtle.bench.peers.features_app:publish_chord"),
    Feature("threads-8", worker=("--pool", "threads", "--concurrency", "8")),
    # the worker's call log at its default level (``bare`` runs at WARNING: logging off), and
    # with a line for every call
    Feature("log-default", worker=("--log-level", "INFO")),
    Feature("log-tasks", worker=("--log-level", "INFO", "--log-tasks")),
    # sends through the outbox in transactions of 1000, relayed to Redis by `hurtle outbox relay`
    # (peers.outbox_app): publish/s compared with bare's send_many, and the relay's lag
    Feature(OUTBOX, publisher="hurtle.bench.peers.outbox_app:publish"),
]
