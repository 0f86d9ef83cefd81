"""What the benchmark ran on: CPU, cores, memory, OS, Python, Redis, date, hurtle commit."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any

from .processes import output


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def _git_commit() -> str:
    return output(
        ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"], 10
    )


def _redis_version(url: str) -> str:
    try:
        import redis

        client = redis.Redis.from_url(url)
        try:
            return str(client.info("server").get("redis_version", ""))
        finally:
            client.close()
    except Exception:  # the report still has everything else
        return ""


def describe(redis_url: str) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{_os_name()} ({platform.release()})",
        "python": platform.python_version(),
        "redis": _redis_version(redis_url),
        "hurtle_commit": _git_commit(),
    }
