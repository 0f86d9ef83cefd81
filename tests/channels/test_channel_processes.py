"""Channels across processes (SQLite on one host, Redis), and the flush at interpreter exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from helpers import hurtle_env
from hurtle import Hurtle
from hurtle.channels import ChannelMessage, Subscription

PUBLISHER = """
import sys
from hurtle import Hurtle

app = Hurtle(sys.argv[1])
ticks = app.channel("procs", flush_interval=3600)
for i in range(int(sys.argv[2])):
    ticks.publish(i)
print("published", flush=True)
# no flush, no close: what is buffered goes out at exit
"""


@pytest.fixture(params=["sqlite", "redis"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'channels.db'}"
    return str(request.getfixturevalue("redis_url"))


def test_messages_from_other_processes_arrive_and_exit_flushes_them(shared_url: str) -> None:
    app = Hurtle(shared_url)
    try:
        with app.subscribe("procs") as sub:
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", PUBLISHER, shared_url, "1500"],
                    env=hurtle_env(),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            got: list[int] = []
            deadline = time.monotonic() + 30
            while len(got) < 3000 and time.monotonic() < deadline:
                msg = sub.get(0.2)
                if msg is not None:
                    got.append(msg.data)
            for proc in procs:
                out, _ = proc.communicate(timeout=30)
                assert proc.returncode == 0 and "published" in out
        assert sorted(got) == sorted(list(range(1500)) * 2)
        assert sub.lost == 0
    finally:
        app.close()


def test_a_forked_child_publishes_as_a_new_publisher_and_drops_the_parents_buffer(
    shared_url: str,
) -> None:
    app = Hurtle(shared_url)
    try:
        ch = app.channel("forked", flush_interval=3600)
        with ch.subscribe() as sub:
            ch.publish("parent")  # buffered when the child is forked
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    ch.publish("child")
                    ch.flush()
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            ch.flush()
            ch.publish("parent again")  # numbered after "parent", not taken for a repeat
            ch.flush()
            got = [m.data for m in _take(sub, 3)]
            assert sub.get(0.5) is None  # the parent's buffered message came once, not twice
        assert sorted(got) == ["child", "parent", "parent again"]
        assert sub.lost == 0
    finally:
        app.close()


def _take(sub: Subscription, n: int) -> list[ChannelMessage]:
    got: list[ChannelMessage] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        msg = sub.get(0.2)
        if msg is not None:
            got.append(msg)
    return got
