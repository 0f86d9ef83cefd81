"""Test hosts in network namespaces, joined by one switch, that a test can cut apart.

A ``Network`` is a few namespaces made with ``ip netns``: one "switch" holding a bridge, and one
per host, each host linked to the switch by a veth pair (``eth0`` in the host, a port of the
bridge in the switch) with an address of a private /24. Every interface lives inside the
namespaces: nothing is added to the machine's own network, so the addresses never collide with
anything, and two runs in parallel (pytest-xdist workers, two checkouts) use namespaces of their
own names. Still, the /24 is derived from the process id, so that two runs never even share
addresses.

Names are ``hpt<pid>-<n>-<role>``: a run's namespaces carry its pid, and ``sweep`` removes those
of runs whose process is gone (killed before their teardown), with whatever still runs inside.

Cutting a host off (``cut``), three ways, as hosts fail:

* ``detach``: its port leaves the bridge. Both ends of its link stay up, so the host sees nothing
  wrong: its packets, and those sent to it, vanish (a switch or a cable between two switches
  failed). TCP retransmits in silence until the link is back.
* ``down``: the switch's end of its link goes down, so the host's ``eth0`` loses its carrier (a
  cable pulled at the host's switch).
* ``route``: the host loses its route to the subnet; its own sends fail at once with "network is
  unreachable", and what others send it is never answered.

``heal`` undoes whichever it was.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The ways ``Network.cut`` can cut a host off.
CUTS = ("detach", "down", "route")
#: The prefix of every namespace these tests make, then the pid of the run that made it.
PREFIX = "hpt"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
#: Namespaces made by this process so far (their names' ``<n>``).
_made = 0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip`` with ``args``; a failure raises ``RuntimeError`` with what ``ip`` said."""
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or ``None`` when they can (checked by making a pair
    of namespaces, a veth between them and a bridge, and running a command in one, then
    removing them)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's; this is {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    a, b = f"{PREFIX}{os.getpid()}-probe-a", f"{PREFIX}{os.getpid()}-probe-b"
    try:
        ip("netns", "add", a)
        ip("netns", "add", b)
        ip("-n", a, "link", "add", "br0", "type", "bridge")
        ip("-n", a, "link", "add", "v", "type", "veth", "peer", "eth0", "netns", b)
        ip("netns", "exec", b, "ip", "link", "set", "eth0", "up")
    except RuntimeError as err:
        return f"cannot make network namespaces here: {err}"
    finally:
        for ns in (a, b):
            ip("netns", "del", ns, check=False)
    return None


def namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove(ns: str) -> None:
    """Kill what runs in ``ns``, then delete it (a namespace outlives its name while a process
    is inside)."""
    for pid in ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", ns, check=False)


def sweep() -> list[str]:
    """Remove the namespaces left by runs whose process is gone; their names."""
    stale = []
    for ns in namespaces():
        m = _NAME.match(ns)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            stale.append(ns)
        except PermissionError:  # alive, another user's
            continue
    for ns in sorted(stale, key=lambda n: n.endswith("-sw")):  # switches last
        remove(ns)
    return stale


def subnet(pid: int) -> str:
    """The first three numbers of this run's /24: ``10.<pid's high byte>.<low byte>``."""
    return f"10.{(pid >> 8) & 255}.{pid & 255}"


@dataclass(frozen=True)
class Host:
    """One namespace on the network: its name, role and address."""

    ns: str
    role: str
    address: str

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this host."""
        return ["ip", "netns", "exec", self.ns, *args]


class Network:
    """A switch and the hosts on it; ``close`` removes them all."""

    def __init__(self) -> None:
        global _made
        _made += 1
        self.tag = f"{PREFIX}{os.getpid()}-{_made}"
        self.net = subnet(os.getpid())
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self.cuts: dict[str, str] = {}
        ip("netns", "add", self.switch)
        try:
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            remove(self.switch)
            raise

    def add(self, role: str) -> Host:
        """A new host, linked to the switch, with the next address."""
        host = Host(f"{self.tag}-{role}", role, f"{self.net}.{len(self.hosts) + 1}")
        port = f"p-{role}"[:15]
        ip("netns", "add", host.ns)
        self.hosts[role] = host  # from now on, close() removes it
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "eth0", "netns", host.ns)
        ip("-n", self.switch, "link", "set", port, "master", "br0")
        ip("-n", self.switch, "link", "set", port, "up")
        ip("-n", host.ns, "link", "set", "lo", "up")
        ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.ns, "link", "set", "eth0", "up")
        return host

    def popen(self, host: Host, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``args`` inside ``host``."""
        return subprocess.Popen(host.command(args), **kwargs)

    def cut(self, host: Host, how: str) -> None:
        """Cut ``host`` off from every other host (``CUTS`` says how)."""
        port = f"p-{host.role}"[:15]
        if how == "detach":
            ip("-n", self.switch, "link", "set", port, "nomaster")
        elif how == "down":
            ip("-n", self.switch, "link", "set", port, "down")
        elif how == "route":
            ip("-n", host.ns, "route", "del", f"{self.net}.0/24", "dev", "eth0")
        else:
            raise ValueError(f"unknown cut {how!r}: one of {CUTS}")
        self.cuts[host.role] = how

    def heal(self, host: Host) -> None:
        """Link ``host`` again as it was before ``cut``."""
        how = self.cuts.pop(host.role)
        port = f"p-{host.role}"[:15]
        if how == "detach":
            ip("-n", self.switch, "link", "set", port, "master", "br0")
        elif how == "down":
            ip("-n", self.switch, "link", "set", port, "up")
        else:
            ip(
                "-n",
                host.ns,
                "route",
                "add",
                f"{self.net}.0/24",
                "dev",
                "eth0",
                "proto",
                "kernel",
                "scope",
                "link",
                "src",
                host.address,
            )

    def close(self) -> None:
        """Kill whatever runs in the hosts, and remove them and the switch."""
        for host in self.hosts.values():
            remove(host.ns)
        remove(self.switch)
