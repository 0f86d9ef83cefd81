"""The dashboard and ``hurtle dead`` with encrypted tasks: arguments and results shown sealed
(``sealed (key 3f2a9c01)``) unless made from an app that has the key, which opens them; the HTTP
enqueue seals what it enqueues for an encrypted task."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hurtle import Hurtle
from hurtle.dashboard import create_app
from hurtle.message import Message
from hurtle.testing import drain

LOCAL = "http://127.0.0.1"
SECRET = "s3cret-value"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Hurtle]:
    app = Hurtle(f"sqlite:///{tmp_path / 'hurtle.db'}", encryption_keys=[os.urandom(32)])

    @app.task(name="vault.echo", queue="vault", encrypt=True, store_result=True)
    def echo(word: str, times: int = 1) -> str:
        return word * times

    @app.task(name="vault.fail", queue="vault", encrypt=True, store_result=True, retries=0)
    def fail(word: str) -> None:
        raise ValueError("refused")

    yield app
    app.close()


def views(target: Hurtle, ok: str, dead: str) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    with TestClient(create_app(target, token=""), base_url=LOCAL) as c:
        done = c.get(f"/api/tasks/{ok}").json()
        looked_up = c.get(f"/api/tasks/{dead}").json()
        (letter,) = c.get("/api/queues/vault/dead").json()
    return done, looked_up, letter


def test_a_dashboard_without_the_key_shows_arguments_and_results_sealed(app: Hurtle) -> None:
    ok = app.tasks["vault.echo"].send(SECRET, times=2)
    dead = app.tasks["vault.fail"].send(SECRET)
    drain(app)
    shown = f"sealed (key {app.keyring.id})"  # type: ignore[union-attr]
    for target in (app.broker, Hurtle(app.broker)):  # a broker, an app without keys
        done, looked_up, letter = views(target, ok.id, dead.id)  # type: ignore[arg-type]
        assert done["args"] == [shown] and done["kwargs"] == {} and done["result"] == shown
        assert looked_up["args"] == [shown] and looked_up["state"] == "dead"
        assert letter["args"] == [shown] and letter["arguments"] == f'["{shown}"]'
        assert SECRET not in str([done, looked_up, letter])


def test_a_dashboard_made_from_an_app_with_the_key_shows_them_opened(app: Hurtle) -> None:
    ok = app.tasks["vault.echo"].send(SECRET, times=2)
    dead = app.tasks["vault.fail"].send(SECRET)
    drain(app)
    done, looked_up, letter = views(app, ok.id, dead.id)
    assert done["args"] == [SECRET] and done["kwargs"] == {"times": 2}
    assert done["result"] == SECRET * 2
    assert looked_up["args"] == [SECRET]
    assert letter["args"] == [SECRET] and letter["arguments"] == f'["{SECRET}"]'


def test_the_http_enqueue_seals_the_arguments_of_an_encrypted_task(app: Hurtle) -> None:
    with TestClient(create_app(app, token=""), base_url=LOCAL) as c:
        answer = c.post(
            "/api/queues/vault/messages",
            json={"task": "vault.echo", "args": [SECRET], "kwargs": {"times": 3}},
        )
    assert answer.status_code == 201, answer.text
    consumer = app.broker.consumer(["vault"])
    (delivery,) = consumer.fetch(1, 0)
    consumer.release([delivery])
    assert SECRET.encode() not in delivery.raw
    assert Message.decode(delivery.raw).headers["sealed"] == app.keyring.id  # type: ignore[union-attr]
    drain(app)
    assert app.handle(answer.json()["id"], app.tasks["vault.echo"]).result(5) == SECRET * 3


def test_hurtle_dead_shows_sealed_arguments_opened_with_the_app_s_keys(
    app: Hurtle, capsys: pytest.CaptureFixture[str]
) -> None:
    from hurtle.cli.dead import _row

    app.tasks["vault.fail"].send(SECRET)
    drain(app)
    (letter,) = app.broker.dead_letters("vault")
    assert _row(letter, app.keyring)["args"] == [SECRET]
    assert _row(letter, None)["args"] == [f"sealed (key {app.keyring.id})"]  # type: ignore[union-attr]
