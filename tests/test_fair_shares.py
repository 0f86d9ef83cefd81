"""Fair shares per key (``fair_key=``, ``fair_weights=``): checked at registration with errors
that name the value; where a call goes (its key's sub-queue); and a real worker that takes the
keys in turn, so that a tenant's 100 calls queued behind another's 20,000 finish within the first
5 % of the run, on the memory broker, SQLite and private Redis, NATS and PostgreSQL servers. The
broker-level runs on every broker are in ``tests/brokers/test_fair_contract.py``."""

from __future__ import annotations

import base64
import json
import os
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import Project
from hurtle import ConfigurationError, Hurtle
from hurtle.names import fair_queue, stored_queue_name_problem
from nats_server import nats_server, nats_url  # noqa: F401 - fixtures
from postgres_server import (  # noqa: F401 - fixtures
    postgres_database,
    postgres_private,
    postgres_server_url,
    postgres_url,
)

BIG, SMALL = 20_000, 100
#: B's last call must be among the first 5 % of the completions.
WITHIN = (BIG + SMALL) * 5 // 100


def order_of_completion(url: str, fair: bool, pool: str = "solo") -> list[str]:
    """Queue A's 20,000 calls, then B's 100, of one task (``fair_key="tenant"`` when ``fair``),
    run them with one burst worker and return the tenants in the order their calls finished."""
    app = Hurtle(url)
    done: list[str] = []
    lock = threading.Lock()
    options: dict[str, Any] = {"fair_key": "tenant"} if fair else {}

    @app.task(name="t.work", queue="work", **options)
    def work(tenant: str, n: int) -> None:
        with lock:
            done.append(tenant)

    for start in range(0, BIG, 5_000):
        work.send_many([("A", n) for n in range(start, start + 5_000)])
    work.send_many([("B", n) for n in range(SMALL)])
    app.worker(burst=True, queues=["work"], pool=pool).run()
    app.broker.close()
    assert len(done) == BIG + SMALL and done.count("B") == SMALL
    return done


def last_of(tenant: str, done: list[str]) -> int:
    return max(i for i, t in enumerate(done) if t == tenant)


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_small_tenant_finishes_within_the_first_5_percent_on_memory(pool: str) -> None:
    done = order_of_completion("memory://", fair=True, pool=pool)
    assert last_of("B", done) < WITHIN, f"B's last call finished {last_of('B', done)}th"


@pytest.mark.parametrize("kind", ["redis", "sqlite", "nats", "postgres"])
def test_a_small_tenant_finishes_within_the_first_5_percent_on_a_server(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'hurtle.db'}"
        if kind == "sqlite"
        else str(request.getfixturevalue(f"{kind}_url"))
    )
    done = order_of_completion(url, fair=True)
    assert last_of("B", done) < WITHIN, f"B's last call finished {last_of('B', done)}th"


def test_without_fair_key_the_small_tenant_waits_behind_the_large_one() -> None:
    done = order_of_completion("memory://", fair=False)
    assert last_of("B", done) >= BIG  # what fair_key is for


def test_fair_key_names_a_parameter_or_is_a_callable() -> None:
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match="'owner' is not one of its parameters"):

        @app.task(fair_key="owner")
        def a(tenant: str) -> None: ...

    with pytest.raises(ConfigurationError, match="fair_key must be the name"):

        @app.task(fair_key=3)  # type: ignore[call-overload]
        def b(tenant: str) -> None: ...

    with pytest.raises(ConfigurationError, match="fair_weights needs fair_key"):

        @app.task(fair_weights={"a": 2})
        def c(tenant: str) -> None: ...


@pytest.mark.parametrize("weight", [0, -1, 1.5, True, "2", 10_001])
def test_a_weight_is_a_whole_number_of_shares(weight: object) -> None:
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match="a weight is a whole number of shares"):

        @app.task(fair_key="tenant", fair_weights={"a": weight})  # type: ignore[dict-item]
        def a(tenant: str) -> None: ...


def test_a_call_goes_to_its_keys_sub_queue_however_it_is_sent() -> None:
    app = Hurtle("memory://")

    @app.task(fair_key="tenant", queue="work")
    def by_name(n: int, tenant: str = "default") -> None: ...

    @app.task(fair_key=lambda n, **kw: f"t{n % 2}", queue="work")
    def by_fn(n: int, **kw: Any) -> None: ...

    assert by_name.message((1,), {"tenant": "acme"}).queue == fair_queue("work", "acme")
    assert by_name.message((1, "acme"), {}).queue == fair_queue("work", "acme")
    assert by_name.message((1,), {}).queue == fair_queue("work", "default")
    assert by_fn.message((3,), {}).queue == fair_queue("work", "t1")
    by_name.options(queue="other").send(1, "acme")
    by_name.send_many([(1, "acme"), (2, "zeta"), {"n": 3}])
    by_name.send(4, "acme")
    stats = app.broker.stats()
    assert {q: s.ready for q, s in stats.items()} == {
        fair_queue("work", "acme"): 2,
        fair_queue("work", "zeta"): 1,
        fair_queue("work", "default"): 1,
        fair_queue("other", "acme"): 1,
    }


def test_a_sub_queues_name_is_safe_whatever_the_key() -> None:
    for key in ["acme", "a b/c{d}*>", "é" * 500, "", "~f0"]:
        name = fair_queue("work", key)
        assert stored_queue_name_problem(name) is None
        assert name.startswith("work~f") and len(name) == len("work~f") + 16
    assert fair_queue("work", "a") != fair_queue("work", "b")
    assert stored_queue_name_problem("work~fnothex0000000000") is not None


def test_a_sealed_tasks_sub_queue_tells_nothing_of_its_key() -> None:
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    app = Hurtle("memory://", encryption_keys=[key])

    @app.task(fair_key="tenant", encrypt=True, fair_weights={"acme": 3})
    def secret(tenant: str) -> None: ...

    queue = secret.message(("acme",), {}).queue
    assert queue != fair_queue(secret.queue, "acme")
    assert app.fair_weights([secret.queue]) == {queue: 3}


def test_a_worker_runs_by_turns_only_when_a_task_is_fair() -> None:
    app = Hurtle("memory://")

    @app.task
    def plain() -> None: ...

    assert app.fair_weights(["default"]) is None

    @app.task(fair_key="tenant", fair_weights={"vip": 4})
    def fair(tenant: str) -> None: ...

    assert app.fair_weights(["a", "b"]) == {fair_queue("a", "vip"): 4, fair_queue("b", "vip"): 4}


def test_retries_dead_letters_unique_locks_and_results_hold_per_call() -> None:
    app = Hurtle("memory://", default_retry_delay=0)
    attempts: dict[int, int] = {}

    @app.task(fair_key="tenant", retries=1, store_result=True, unique_for=60)
    def flaky(tenant: str, n: int) -> int:
        attempts[n] = attempts.get(n, 0) + 1
        if n == 2 or attempts[n] == 1:
            raise ValueError(f"attempt {attempts[n]} of {n}")
        return n * 10

    handles = [flaky.send("A", 1), flaky.send("B", 2)]
    assert flaky.send("A", 1).id == handles[0].id  # held by the unique lock
    app.worker(burst=True).run()
    assert handles[0].result(timeout=5) == 10 and attempts == {1: 2, 2: 2}
    assert handles[1].state() == "dead"
    dead = app.broker.find_dead(handles[1].id)
    assert dead is not None and "attempt 2 of 2" in dead.reason
    assert flaky.send("A", 1).id != handles[0].id  # its lock ended with its run
    # the worker's counts name the queue, its keys summed (as a task without fair_key counts)
    assert [(c.queue, c.processed, c.retried, c.dead_lettered) for c in app.broker.totals()] == [
        ("default", 4, 2, 1)
    ]


def test_status_and_the_dashboard_count_a_queues_keys_in_it() -> None:
    from hurtle.dashboard.queries import queue_stats

    app = Hurtle("memory://")

    @app.task(fair_key="tenant", queue="work")
    def work(tenant: str) -> None: ...

    @app.task(queue="work")
    def plain() -> None: ...

    work.send_many([("a",), ("a",), ("b",)])
    plain.send()
    app.pause("work")
    stats = queue_stats(app.broker, app.queues())
    assert set(stats) == {"default", "work"}
    assert stats["work"].ready == 4 and stats["work"].paused


FAILING = textwrap.dedent(
    """
    from hurtle import Hurtle

    app = Hurtle()  # HURTLE_BROKER_URL comes from the environment


    @app.task(name="tasks.work", queue="work", fair_key="tenant", retries=0)
    def work(tenant, n):
        raise ValueError(f"{tenant} {n} failed")
    """
)


def test_a_fair_queues_dead_letters_and_waiting_calls_are_its_own_in_the_cli_and_dashboard(
    tmp_path: Path,
) -> None:
    """What waits in or died in a key's sub-queue is listed, retried and purged as the queue's:
    ``hurtle dead`` and the dashboard name ``work`` once, never a sub-queue."""
    from starlette.testclient import TestClient

    from hurtle.dashboard import create_app
    from hurtle.dashboard.queries import stats_of

    project = Project(tmp_path, FAILING, ())
    app = project.app
    work = app.task(name="tasks.work", queue="work", fair_key="tenant", retries=0)(
        lambda tenant, n: None
    )
    work.send_many([("a", 1), ("b", 2)])
    assert project.hurtle("worker", "tasks:app", "--burst").returncode == 0
    listed = project.hurtle("dead", "tasks:app", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted((r["queue"], r["args"][0]) for r in rows) == [("work", "a"), ("work", "b")]
    with TestClient(create_app(app, token=""), base_url="http://127.0.0.1") as client:
        queues = {r["name"]: r for r in client.get("/api/queues").json()}
        assert set(queues) == {"default", "work"} and queues["work"]["dead"] == 2
        dead = client.get("/api/queues/work/dead").json()
        assert sorted(d["queue"] for d in dead) == ["work", "work"]

    retried = project.hurtle("dead", "tasks:app", "retry")
    assert "put back 2 dead letters" in retried.stdout, retried.stdout
    keys = [fair_queue("work", "a"), fair_queue("work", "b")]
    assert [s.ready for s in app.broker.stats(keys).values()] == [1, 1]  # each in its key
    assert stats_of(app.broker, ["work"])["work"].ready == 2
    purged = project.hurtle("queue", "tasks:app", "purge", "work", "--yes")
    assert "2 waiting message(s) dropped" in purged.stdout, (purged.stdout, purged.stderr)
    assert stats_of(app.broker, ["work"])["work"].ready == 0
