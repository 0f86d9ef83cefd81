"""Helpers for tests: private servers on free ports and the hurtle CLI in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hurtle import Hurtle
from hurtle.brokers import Delivery, StoredResults

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` on a free port, in its own directory."""

    def __init__(self, workdir: Path, *, appendonly: bool = False) -> None:
        self.workdir = workdir
        self.appendonly = appendonly
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class RedisClusterServer:
    """A private Redis Cluster: three masters and three replicas on free loopback ports, each
    ``redis-server`` in its own directory, joined by ``redis-cli --cluster create``. With
    ``tls``: every node speaks only TLS (clients, the cluster bus and replication), with a
    certificate of a throwaway CA made by ``openssl`` in the work directory."""

    #: Milliseconds before a silent master is failed over (low: tests kill masters).
    NODE_TIMEOUT = 1000

    def __init__(
        self, workdir: Path, *, masters: int = 3, replicas: int = 1, tls: bool = False
    ) -> None:
        self.workdir = workdir
        self.masters = masters
        self.replicas = replicas
        self.ports = [_free_cluster_port() for _ in range(masters * (1 + replicas))]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.tls_dir: Path | None = make_certificates(workdir / "tls") if tls else None

    @property
    def url(self) -> str:
        if self.tls_dir is not None:
            ca = self.tls_dir / "ca.crt"
            return f"rediss+cluster://127.0.0.1:{self.ports[0]}?ssl_ca_certs={ca}"
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def cli(self, *args: str) -> list[str]:
        """A ``redis-cli`` command line for this cluster's nodes."""
        if self.tls_dir is None:
            return ["redis-cli", *args]
        return ["redis-cli", "--tls", "--cacert", str(self.tls_dir / "ca.crt"), *args]

    def start_node(self, port: int) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        node_dir = self.workdir / str(port)
        node_dir.mkdir(exist_ok=True)
        args = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(node_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(node_dir / "nodes.conf"),
            "--cluster-node-timeout",
            str(self.NODE_TIMEOUT),
            "--repl-diskless-sync-delay",
            "0",
            "--logfile",
            str(node_dir / "redis.log"),
        ]
        if self.tls_dir is not None:  # TLS only: the plain port is closed
            args[1:3] = ["--port", "0", "--tls-port", str(port)]
            args += [
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
                "--tls-cert-file",
                str(self.tls_dir / "server.crt"),
                "--tls-key-file",
                str(self.tls_dir / "server.key"),
                "--tls-ca-cert-file",
                str(self.tls_dir / "ca.crt"),
                "--tls-auth-clients",
                "no",
            ]
        self.procs[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if self.tls_dir is None:
            _wait_for_pong(port)
        else:
            _wait_for_tls_pong(self, port)

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.skip("redis-cli is not installed")
        for port in self.ports:
            self.start_node(port)
        subprocess.run(
            [
                cli,
                *self.cli()[1:],
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()

    def cluster_info(self, port: int) -> dict[str, str]:
        out = subprocess.run(
            self.cli("-p", str(port), "cluster", "info"),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return dict(line.split(":", 1) for line in out.split() if ":" in line)

    def replication(self, port: int) -> dict[str, str]:
        out = subprocess.run(
            self.cli("-p", str(port), "info", "replication"),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return dict(line.split(":", 1) for line in out.split() if ":" in line)

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node sees the cluster as ok with all slots served, and every
        replica is in sync with its master."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [self.cluster_info(p) for p in self.procs]
            if all(
                i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == "16384"
                for i in infos
            ) and all(
                r.get("role") == "master" or r.get("master_link_status") == "up"
                for r in map(self.replication, self.procs)
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis cluster did not become ok")

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key`` now."""
        out = subprocess.run(
            self.cli("-c", "-p", str(next(iter(self.procs))), "cluster", "keyslot", key),
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        slot = int(out.strip())
        nodes = subprocess.run(
            self.cli("-p", str(next(iter(self.procs))), "cluster", "nodes"),
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        for line in nodes.splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for r in fields[8:]:
                lo, _, hi = r.partition("-")
                if r[0] != "[" and int(lo) <= slot <= int(hi or lo):
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise RuntimeError(f"no master serves slot {slot}")

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait()

    def flushall(self) -> None:
        for port in self.procs:
            subprocess.run(
                self.cli("-p", str(port), "flushall"),
                capture_output=True,
                timeout=10,
                check=False,
            )

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(1000):
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def make_certificates(where: Path) -> Path:
    """A throwaway CA and a certificate it signed for 127.0.0.1, made with ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where.mkdir(parents=True, exist_ok=True)
    steps = [
        ["genrsa", "-out", "ca.key", "2048"],
        [
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-days",
            "2",
            "-subj",
            "/CN=hurtle-test-ca",
            "-out",
            "ca.crt",
        ],
        ["genrsa", "-out", "server.key", "2048"],
        ["req", "-new", "-key", "server.key", "-subj", "/CN=127.0.0.1", "-out", "server.csr"],
    ]
    for step in steps:
        subprocess.run(["openssl", *step], cwd=where, check=True, capture_output=True)
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
        cwd=where,
        check=True,
        capture_output=True,
    )
    return where


def make_client_certificate(where: Path, name: str, *, ca: Path | None = None) -> Path:
    """A client certificate ``<name>.crt`` and its key ``<name>.key`` in ``where``, signed by
    the CA of ``make_certificates`` in ``ca`` (default: ``where``), with ``openssl``; a CA of
    its own when ``ca`` names a directory without one (a certificate nobody else trusts)."""
    ca = where if ca is None else ca
    if not (ca / "ca.crt").exists():
        make_certificates(ca)
    steps = [
        ["genrsa", "-out", f"{name}.key", "2048"],
        ["req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr"],
    ]
    for step in steps:
        subprocess.run(["openssl", *step], cwd=where, check=True, capture_output=True)
    (where / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n")
    sign = ["x509", "-req", "-in", f"{name}.csr", "-CA", str(ca / "ca.crt")]
    sign += ["-CAkey", str(ca / "ca.key"), "-CAcreateserial", "-days", "2"]
    sign += ["-extfile", f"{name}.ext", "-out", f"{name}.crt"]
    subprocess.run(["openssl", *sign], cwd=where, check=True, capture_output=True)
    return where / f"{name}.crt"


def _wait_for_tls_pong(cluster: RedisClusterServer, port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = subprocess.run(
            cluster.cli("-p", str(port), "ping"), capture_output=True, text=True, check=False
        )
        if out.stdout.strip() == "PONG":
            return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not start on TLS port {port}")


def _wait_for_pong(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"redis-server did not start on port {port}")


def hurtle_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess running hurtle from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]
    )
    env.update(extra)
    return env


def run_hurtle(
    *args: str, cwd: Path | None = None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the ``hurtle`` CLI in a real subprocess and capture what it prints. Its stdin is
    no terminal (as in a script): a command that would ask a question refuses instead."""
    return subprocess.run(
        [sys.executable, "-m", "hurtle", *args],
        cwd=cwd,
        env=hurtle_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_hurtle_at_a_terminal(
    *args: str, answer: str, cwd: Path | None = None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """``run_hurtle`` with a terminal (a pseudo-terminal) as stdin, on which ``answer`` is
    typed: what a person at a terminal answers to a question (stdout and stderr are pipes)."""
    main, terminal = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hurtle", *args],
            cwd=cwd,
            env=hurtle_env(**env),
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(terminal)
        terminal = -1
        os.write(main, answer.encode())  # kept by the terminal until the command reads it
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    finally:
        os.close(main)
        if terminal != -1:
            os.close(terminal)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Project:
    """A directory with a tasks.py, its own broker (SQLite unless ``url``) and a log of task runs.

    ``tasks_source`` is the module's text; its tasks append lines to the file ``$RUNS_LOG``.
    The test side registers ``task_names`` on an app of its own, to send them.
    """

    def __init__(
        self, root: Path, tasks_source: str, task_names: Sequence[str], url: str | None = None
    ) -> None:
        self.root = root
        (root / "tasks.py").write_text(tasks_source)
        self.log = root / "runs.log"
        self.log.touch()
        self.url = url or f"sqlite:///{root / 'hurtle.db'}"
        self.env = {"HURTLE_BROKER_URL": self.url, "RUNS_LOG": str(self.log)}
        self.app = Hurtle(self.url)
        if url is None:  # its file exists, as after a first send (only those create one)
            self.app.broker.queues()
        self._started = 0
        self._outputs: dict[int, Path] = {}
        for name in task_names:
            self.app.task(name=name, retries=0)(lambda *a: None)

    def send(self, name: str, *args: object) -> str:
        return self.app.tasks[name].send(*args).id

    def send_many(self, name: str, calls: list[tuple[object, ...]]) -> None:
        self.app.tasks[name].send_many(calls)

    def runs(self) -> list[str]:
        return self.log.read_text().splitlines()

    def lines(self, word: str) -> list[str]:
        """Task numbers of the ``start`` or ``done`` lines, in order."""
        return [r.split()[1] for r in self.runs() if r.startswith(word + " ")]

    def pids(self) -> set[str]:
        return {r.split()[2] for r in self.runs()}

    def hurtle(
        self, *args: str, timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return run_hurtle(*args, cwd=self.root, timeout=timeout, **{**self.env, **env})

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        """Start hurtle in the background; its output goes to a file (``output(proc)``)."""
        self._started += 1
        out = self.root / f"process-{self._started}.log"
        with out.open("w") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hurtle", *args],
                cwd=self.root,
                env=hurtle_env(**{**self.env, **env}),
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self._outputs[proc.pid] = out
        return proc

    def output(self, proc: subprocess.Popen[str]) -> str:
        return self._outputs[proc.pid].read_text()

    def stop(self, proc: subprocess.Popen[str], timeout: float = 30) -> int:
        """Wait for ``proc`` to exit (killing it if it overstays); its exit status."""
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"still running after {timeout}s:\n{self.output(proc)}") from None

    def status(self) -> dict[str, dict[str, int]]:
        """What ``hurtle status --json`` prints, per queue."""
        out = self.hurtle("status", "tasks:app", "--json")
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout)["queues"])

    def stats(self) -> dict[str, int]:
        s = self.app.broker.stats(["default"])["default"]
        return {"ready": s.ready, "delayed": s.delayed, "in_flight": s.in_flight, "dead": s.dead}

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out; runs so far: {self.runs()[-5:]}"
            time.sleep(0.02)


def stored_batch(
    deliveries: Sequence[Any], values: Sequence[Any], *, whole: bool = True, ttl: float = 60.0
) -> StoredResults:
    """What the results middleware stores for a batch of calls of ``tests.add`` that returned
    ``values`` (one per delivery, the message being the delivery's bytes): ``Batch``es kept
    whole when ``whole``, else one record per call."""
    from hurtle.message import Message
    from hurtle.middleware import Calls
    from hurtle.middleware.results import Results

    app = Hurtle("memory://")
    task = app.task(name="tests.add", store_result=True, result_ttl=ttl)(lambda *a: None)
    calls = Calls(task)
    for d, value in zip(deliveries, values, strict=True):
        calls.deliveries.append(d)
        calls.messages.append(Message.decode(d.raw))
        calls.results.append(value)
        calls.runtimes.append(0.25)
    results = Results(app)
    results.whole = whole
    results.after_calls(calls)
    assert isinstance(calls.stored, StoredResults)
    return calls.stored


class BatchState:
    """What ``Processor.process_many`` reads and writes on its executor (``BatchState``), for
    tests that run a batch without one."""

    def __init__(self) -> None:
        self.pending: deque[Delivery] = deque()
        self.current: Delivery | None = None
        self.stopping = False
        self.unstarted: list[Delivery] = []
        self.time_limit: float | None = None
        self.overran: list[Delivery] = []


class StallProof:
    """A block of a test that uses a short heartbeat timeout, whose failure is skipped, not
    reported, when the machine stalled long enough for a live consumer to be taken for dead.

    ``with StallProof(timeout) as clock:`` times the block from entry; ``clock.beat()`` marks
    the moment a consumer that must stay live beat. If an assertion fails and some stretch
    between beats (or since entry) lasted longer than ``0.8 * timeout``, the broker was right
    to take that consumer for dead and the test is skipped with the figure. On a machine that
    keeps up no stretch comes near it, and every failure is reported.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.longest = 0.0
        self._last = 0.0

    def __enter__(self) -> StallProof:
        self._last = time.monotonic()
        return self

    def beat(self) -> None:
        now = time.monotonic()
        self.longest = max(self.longest, now - self._last)
        self._last = now

    def __exit__(self, kind: type[BaseException] | None, error: object, tb: object) -> None:
        if kind is None or not issubclass(kind, (AssertionError, ValueError)):
            return
        self.beat()
        if self.longest > 0.8 * self.timeout:
            pytest.skip(
                f"the machine stalled {self.longest:.2f} s between beats of a consumer with a "
                f"{self.timeout} s heartbeat timeout: it was rightly taken for dead"
            )


def run_django_client(where: Path, database_url: str, body: str) -> str:
    """Run ``body`` in a process of its own whose Django project uses ``database_url`` (Django's
    settings are configured once per process), after ``django.setup()`` with ``connection``,
    ``transaction`` and ``Hurtle`` imported; what it printed, asserted to have exited 0."""
    import textwrap

    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(database_url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info["dbname"],
        "USER": "postgres",
        "HOST": info["host"],
        "PORT": info.get("port", "5432"),
    }
    script = where / "django_client.py"
    script.write_text(
        "import django\n"
        "from django.conf import settings\n\n"
        f"settings.configure(DATABASES={{'default': {database!r}}})\n"
        "django.setup()\n"
        "from django.db import connection, transaction\n"
        "from hurtle import Hurtle\n\n" + textwrap.dedent(body)
    )
    src = Path(__file__).resolve().parents[1] / "src"
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def workflow_app() -> Hurtle:
    """The app of the workflow tests, on the memory broker: ``add``, ``mul``, ``total`` (a
    chord callback that records each list it is given in ``app.calls``) and ``boom`` (fails,
    retried once)."""
    app = Hurtle("memory://", default_retry_delay=0.01, heartbeat_timeout=5)

    @app.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="mul")
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="total")
    def total(xs: list[int], offset: int = 0) -> int:
        calls.append(xs)
        return sum(xs) + offset

    @app.task(name="boom", retries=1)
    def boom(x: int) -> int:
        raise ValueError(f"boom {x}")

    calls: list[list[int]] = []
    app.calls = calls  # type: ignore[attr-defined]
    return app
