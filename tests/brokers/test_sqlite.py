"""What only the SQLite broker promises: one file shared by real processes, and clear URL errors."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hurtle.brokers import QueueStats, make_broker
from hurtle.brokers.sqlite import SQLiteBroker
from hurtle.errors import ConfigurationError
from hurtle.ids import new_id
from hurtle.message import Message

SRC = Path(__file__).resolve().parents[2] / "src"

# A consumer process: waits for "go" on stdin, then fetches and acks until the queue stays empty,
# printing the ids it got as one JSON line.
CONSUMER = """
import json, sys
from hurtle.brokers import make_broker
from hurtle.message import Message
broker = make_broker(sys.argv[1])
consumer = broker.consumer(["q"])
print("ready", flush=True)
sys.stdin.readline()
got = []
while batch := consumer.fetch(int(sys.argv[2]), float(sys.argv[3])):
    got += [Message.decode(d.raw).id for d in batch]
    consumer.ack(batch)
consumer.close()
broker.close()
print(json.dumps(got), flush=True)
"""


def spawn_consumer(url: str, max_count: int, timeout: float) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, url, str(max_count), str(timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finish(proc: subprocess.Popen[str]) -> list[str]:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    ids: list[str] = json.loads(out.strip().splitlines()[-1])
    return ids


def messages(n: int) -> list[Message]:
    return [Message(id=new_id(), task="tests.add", queue="q", args=(i,)) for i in range(n)]


def test_two_processes_on_one_file_get_disjoint_complete_sets(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    broker = make_broker(url)
    ms = messages(6000)
    for i in range(0, len(ms), 1000):
        broker.publish(ms[i : i + 1000])
    procs = [spawn_consumer(url, 50, 0.5) for _ in range(2)]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    first, second = (finish(proc) for proc in procs)
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(m.id for m in ms)
    assert broker.stats(["q"])["q"] == QueueStats()
    broker.close()


def test_a_send_from_another_process_wakes_a_blocked_fetch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    broker = make_broker(url)
    proc = spawn_consumer(url, 10, 5.0)  # stops after 5 s without anything new
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    time.sleep(0.3)  # the child is blocked in fetch now
    [m] = messages(1)
    broker.publish([m])
    assert finish(proc) == [m.id]
    broker.close()


def test_the_file_is_created_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "hurtle.db"
    broker = make_broker(f"sqlite:///{path}")
    assert path.is_file()
    assert broker.queues() == []
    broker.close()


def test_a_missing_directory_is_a_configuration_error_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "hurtle.db"
    with pytest.raises(ConfigurationError, match=r"no directory .*/a/b'") as info:
        make_broker(f"sqlite:///{path}")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "a").exists()


def test_three_slashes_name_a_path_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    broker = make_broker("sqlite:///sub/hurtle.db")
    assert isinstance(broker, SQLiteBroker)
    assert (tmp_path / "sub" / "hurtle.db").is_file()
    broker.close()


def test_a_directory_as_the_database_path_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot open the SQLite broker file"):
        make_broker(f"sqlite:///{tmp_path}")


def test_a_path_under_a_regular_file_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a directory")
    with pytest.raises(ConfigurationError) as info:
        make_broker(f"sqlite:///{tmp_path / 'plain' / 'hurtle.db'}")
    assert "\n" not in str(info.value)


def test_a_file_that_is_not_a_database_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a SQLite database, just some text " * 100)
    with pytest.raises(ConfigurationError, match=r"junk\.db"):
        make_broker(f"sqlite:///{path}")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://host/x.db"])
def test_a_sqlite_url_without_a_path_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="sqlite:///"):
        make_broker(url)


def test_state_survives_reopening_the_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    with make_broker(url) as broker:
        [m] = messages(1)
        broker.publish([m])
    with make_broker(url) as broker:
        [d] = broker.consumer(["q"]).fetch(1, 1)
        assert Message.decode(d.raw) == m


def test_a_file_of_an_older_schema_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body BLOB)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigurationError, match=r"older hurtle.*delete it or move it"):
        make_broker(f"sqlite:///{path}")


def test_a_file_of_the_previous_schema_is_upgraded_and_its_dead_letters_found_by_id(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hurtle.db"
    with make_broker(f"sqlite:///{path}") as broker:
        [m] = messages(1)
        broker.publish([m])
        c = broker.consumer(["q"])
        [d] = c.fetch(1, 1)
        c.dead_letter(d, "failed")
    conn = sqlite3.connect(path)  # back to version 4: dead letters without their message ids
    conn.execute("DROP INDEX dead_message")
    conn.execute("ALTER TABLE dead DROP COLUMN message_id")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()
    with make_broker(f"sqlite:///{path}") as broker:
        found = broker.find_dead(m.id)
        assert found is not None and found.message() == m


def test_released_messages_go_to_the_back_of_their_priority(tmp_path: Path) -> None:
    with make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}") as broker:
        ms = messages(5)
        broker.publish(ms)
        c = broker.consumer(["q"])
        held = c.fetch(2, 1)
        c.release(held)  # unlike Redis: behind what was waiting, in their own order
        got = [Message.decode(d.raw).id for d in c.fetch(10, 1)]
        assert got == [m.id for m in ms[2:] + ms[:2]]


def test_due_delayed_messages_come_after_those_already_ready_in_publish_order(
    tmp_path: Path,
) -> None:
    with make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}") as broker:
        eta = time.time() + 0.3
        late = [Message(id=new_id(), task="t", queue="q", eta=eta) for _ in range(3)]
        broker.publish(late)
        ready = messages(2)
        broker.publish(ready)
        time.sleep(0.4)
        got = [Message.decode(d.raw).id for d in broker.consumer(["q"]).fetch(10, 1)]
        assert got == [m.id for m in ready + late]


def claims(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        n: int = conn.execute("SELECT count(*) FROM claims").fetchone()[0]
        return n
    finally:
        conn.close()


def test_claims_are_dropped_once_nothing_of_them_is_held(tmp_path: Path) -> None:
    path = tmp_path / "hurtle.db"
    with make_broker(f"sqlite:///{path}") as broker:
        ms = messages(10)
        broker.publish(ms)
        c = broker.consumer(["q"])
        first = c.fetch(4, 1)
        second = c.fetch(4, 1)
        assert claims(path) == 2
        c.ack(first[:2])
        assert claims(path) == 2
        c.ack(first[2:])
        assert claims(path) == 1
        third = c.ack_and_fetch(second, 10, 1)
        assert claims(path) == 1
        c.retry(third[0], ms[8])
        c.dead_letter(third[1], "no")
        assert claims(path) == 0
        c.release(c.fetch(10, 1))
        assert claims(path) == 0
        c.fetch(10, 1)
        c.close()
        assert claims(path) == 0
        assert broker.stats(["q"])["q"] == QueueStats(ready=1, dead=1)


def test_message_ids_are_never_reused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hurtle.db'}"
    receipts: list[int] = []
    for _ in range(2):  # emptied then reopened: a table's max(rowid) + 1 would start over
        with make_broker(url) as broker:
            broker.publish(messages(3))
            c = broker.consumer(["q"])
            got = c.fetch(10, 1)
            receipts += [d.receipt for d in got]
            c.ack(got)
            c.close()
    assert receipts == sorted(set(receipts))


def test_a_batch_of_one_queue_and_priority_is_stored_whole_and_in_order(tmp_path: Path) -> None:
    # 237 = two statements of 100 rows, three of 10 and 7 rows left over (``_insert_run``)
    with make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}") as broker:
        ms = messages(237)
        broker.publish(ms)
        mixed = [Message(id=new_id(), task="t", queue="q", priority=i % 2) for i in range(30)]
        broker.publish(mixed)
        c = broker.consumer(["q"])
        got = [Message.decode(d.raw).id for d in c.fetch(1000, 1)]
        first = [m.id for m in mixed if m.priority == 1]
        assert got == first + [m.id for m in ms] + [m.id for m in mixed if m.priority == 0]


def test_an_ack_settles_exactly_the_deliveries_it_names(tmp_path: Path) -> None:
    with make_broker(f"sqlite:///{tmp_path / 'hurtle.db'}") as broker:
        ms = messages(10)
        broker.publish(ms)
        c = broker.consumer(["q"])
        ds = c.fetch(10, 1)
        c.ack(ds[0:3])  # every id of a range
        c.ack([ds[4], ds[6]])  # with a gap
        c.ack([ds[7], ds[7], ds[9]])  # as many receipts as the range is long, one twice
        assert broker.stats(["q"])["q"] == QueueStats(in_flight=3)
        c.close()
        again = broker.consumer(["q"]).fetch(10, 1)
        assert [Message.decode(d.raw).id for d in again] == [ms[3].id, ms[5].id, ms[8].id]
