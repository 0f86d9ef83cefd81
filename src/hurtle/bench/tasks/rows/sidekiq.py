"""Row ``sidekiq``: Ruby's reference job queue, run when ``ruby`` and the ``sidekiq`` gem are here.

The job and publisher are Ruby scripts in ``hurtle/bench/sidekiq/`` (``bench_worker.rb``,
``bench_publish.rb``); the worker is ``sidekiq -r bench_worker.rb`` with Sidekiq's defaults
(concurrency 10 in 6.x, one queue, basic fetch: a job popped is gone, so not acknowledged).
Install on Debian with ``apt-get install ruby-sidekiq``.
"""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

from ...harness.processes import output
from ...harness.scenario import Scenario

#: The Ruby scripts (shipped as package data).
SCRIPTS = Path(__file__).resolve().parents[2] / "sidekiq"
INSTALL = "apt-get install ruby-sidekiq (or gem install sidekiq)"


@cache
def sidekiq_version() -> str:
    """The gem's version, or ``""`` when ruby cannot load it."""
    ruby = shutil.which("ruby")
    if ruby is None:
        return ""
    return output([ruby, "-e", 'require "sidekiq"; print Sidekiq::VERSION'], 30)


class _SidekiqScenario(Scenario):
    def version(self) -> str:
        return sidekiq_version()

    def missing(self) -> str | None:
        absent = super().missing()
        if absent is None and not sidekiq_version():
            return f"ruby cannot load the sidekiq gem: {INSTALL}"
        return absent


ROWS: list[Scenario] = [
    _SidekiqScenario(
        name="sidekiq",
        system="Sidekiq",
        guarantee="not acknowledged",
        config="sidekiq -r bench_worker.rb, concurrency 10 (default), basic fetch; "
        "published with perform_async",
        publisher=("ruby", str(SCRIPTS / "bench_publish.rb"), "{count}"),
        worker=("sidekiq", "-r", str(SCRIPTS / "bench_worker.rb")),
        programs=("ruby", "sidekiq"),
        install=INSTALL,
        version_of=None,
    ),
]
