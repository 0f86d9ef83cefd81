"""The PostgreSQL peers of ``hurtle bench tasks`` (``pgqueuer``, ``procrastinate``) are declared
to run like the other peer rows: on the database of ``--broker-url postgresql://``, in a schema of
their own that is dropped before every PostgreSQL row, skipped with their install command when
their package is absent, and compared with hurtle on PostgreSQL under the table. A short publish
through each row's own publisher checks that the row counts what its peer leaves in the schema
it writes to. Nothing here runs a worker or looks at timings."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hurtle.bench.harness import registry, servers
from hurtle.bench.harness.runner import Runner
from hurtle.bench.harness.scenario import Row, Scenario
from hurtle.bench.tasks import report
from postgres_server import postgres_database, postgres_server_url  # noqa: F401 - fixtures

#: Each row, the distribution it measures and the module its worker runs or loads.
PEERS = {
    "pgqueuer": ("pgqueuer", "hurtle.bench.peers.pgqueuer_app"),
    "procrastinate": ("procrastinate", "hurtle.bench.peers.procrastinate_app"),
}


def _row(name: str) -> Scenario:
    rows = {row.name: row for row in registry.discover("hurtle.bench.tasks.rows")}
    assert name in rows, f"no row {name!r} in hurtle bench tasks: {sorted(rows)}"
    row: Scenario = rows[name]
    return row


def _schema(row: Scenario) -> str:
    (schema,) = (v for k, v in row.env.items() if k in ("PGQUEUER_SCHEMA", "HURTLE_BENCH_SCHEMA"))
    return schema


@pytest.mark.parametrize("name", PEERS)
def test_the_row_runs_its_peer_on_postgres_in_a_schema_the_harness_drops(name: str) -> None:
    package, peer = PEERS[name]
    row = _row(name)
    assert row.store == "postgres"
    assert row.version_of == package and package in row.modules
    assert package in row.install and ".[bench]" in row.install
    assert row.leftover is not None
    schema = _schema(row)
    assert schema in servers.POSTGRES_SCHEMAS and schema != servers.POSTGRES_SCHEMA
    # publisher and worker name the peer module, which exists (not imported: it reads its env)
    assert row.publisher[-2] == f"{peer}:publish"
    assert any(peer in part for part in row.worker), row.worker
    spec = importlib.util.find_spec(peer)
    assert spec is not None and spec.origin is not None and Path(spec.origin).is_file()
    assert row.config and row.guarantee == "acknowledged"


def test_each_postgres_row_has_a_schema_of_its_own() -> None:
    schemas = [_schema(_row(name)) for name in PEERS]
    assert len(set(schemas)) == len(schemas)
    assert len(set(servers.POSTGRES_SCHEMAS)) == len(servers.POSTGRES_SCHEMAS)


@pytest.mark.parametrize("name", PEERS)
def test_the_row_is_skipped_with_its_install_command_when_its_package_is_absent(
    name: str, tmp_path: Path
) -> None:
    row = _row(name)
    absent = dataclasses.replace(row, modules=("hurtle_no_such_package", *row.modules))
    runner = Runner("redis://127.0.0.1:1", tmp_path, postgres_url="postgresql://u@127.0.0.1/db")
    measured = runner.run(absent, 10)
    assert measured.skipped == f"hurtle_no_such_package is not importable: {row.install}"
    # and without a PostgreSQL --broker-url it says what to pass
    measured = Runner("redis://127.0.0.1:1", tmp_path).run(row, 10)
    assert measured.skipped is not None and "--broker-url postgresql://" in measured.skipped


def _done(name: str, consume_rate: float) -> Row:
    return Row(name=name, system=name, count=1001, consumed=1001, consume_s=1000 / consume_rate)


def test_hurtle_on_postgres_is_held_to_five_times_pgqueuer() -> None:
    rows = [_done("hurtle-postgres-solo", 6000.0), _done("pgqueuer", 1000.0)]
    (ratio,) = report.ratios(rows)
    assert ratio.label == "consume: hurtle on PostgreSQL solo / pgqueuer"
    assert ratio.target == 5 and ratio.value == pytest.approx(6.0)
    assert ratio.verdict == "met"
    (ratio,) = report.ratios([_done("hurtle-postgres-solo", 4000.0), _done("pgqueuer", 1000.0)])
    assert ratio.verdict == "MISSED"


@pytest.mark.parametrize("name", PEERS)
def test_what_the_publisher_writes_is_what_the_row_counts_and_the_flush_drops(
    name: str,
    postgres_database: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    package, _ = PEERS[name]
    pytest.importorskip(package)
    row = _row(name)
    url = servers.postgres_bench_url(postgres_database)
    env = {**os.environ, **row.env, "HURTLE_BROKER_URL": url}
    env["HURTLE_BENCH_RESULT_FILE"] = str(tmp_path / "publish.json")
    argv = [part.format(python=sys.executable, count="7") for part in row.publisher]
    servers.flush_postgres(postgres_database)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert '"count": 7' in (tmp_path / "publish.json").read_text()
    assert row.leftover is not None and row.leftover(url) == 7
    servers.flush_postgres(postgres_database)
    import psycopg

    with psycopg.connect(postgres_database) as conn:
        found = conn.execute(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name = %s",
            (_schema(row),),
        ).fetchall()
    assert found == []
