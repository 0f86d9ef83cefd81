"""Rows ``funboost-redis`` and ``funboost-ack``: funboost (``peers.funboost_app``) with its plain
``REDIS`` kind (no acknowledgement) and ``REDIS_ACK_ABLE``.

funboost configures itself from ``funboost_config.py`` / ``nb_log_config.py`` found on
``sys.path``, and writes them into the first ``PYTHONPATH`` entry when they are missing. Each
row therefore gets both files in its own work directory, put first on ``PYTHONPATH``: the
shipped defaults with this run's Redis and quieter start-up logging.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from ...harness.scenario import Scenario
from ..common import peer_row


def _package_file(package: str, name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{package} is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / name


def prepare(workdir: Path, redis_url: str) -> dict[str, str]:
    url = urlsplit(redis_url)
    db = (url.path or "/0").lstrip("/") or "0"
    text = _package_file("funboost", "funboost_config_deafult.py").read_text(encoding="utf8")
    for name, value in (
        ("REDIS_HOST", repr(url.hostname or "127.0.0.1")),
        ("REDIS_PORT", str(url.port or 6379)),
        ("REDIS_DB", db),
        ("REDIS_PASSWORD", repr(url.password or "")),
        ("SHOW_HOW_FUNBOOST_CONFIG_SETTINGS", "False"),
        ("FUNBOOST_PROMPT_LOG_LEVEL", "logging.WARNING"),
    ):
        text = re.sub(
            rf"^(\s*{name}\s*=\s*)[^#\n]*", rf"\g<1>{value}  ", text, count=1, flags=re.MULTILINE
        )
    (workdir / "funboost_config.py").write_text(text, encoding="utf8")
    nb_log = _package_file("nb_log", "nb_log_config_default.py")
    (workdir / "nb_log_config.py").write_text(nb_log.read_text(encoding="utf8"), encoding="utf8")
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": f"{workdir}{os.pathsep}{path}" if path else str(workdir)}


def _row(kind: str, name: str, guarantee: str) -> Scenario:
    return peer_row(
        "funboost",
        name,
        "funboost",
        guarantee,
        f"broker kind {kind}, SINGLE_THREAD concurrent mode, 1 process",
        worker=("hurtle.bench.peers.funboost_app",),
        env={"HURTLE_BENCH_FUNBOOST_KIND": kind},
        prepare=prepare,
    )


ROWS = [
    _row("REDIS", "funboost-redis", "not acknowledged"),
    _row("REDIS_ACK_ABLE", "funboost-ack", "acknowledged"),
]
