"""Encrypted tasks (``encrypt=True``): what is sealed where, key rotation, what a worker does with
what it cannot open, settings, and that tasks which do not seal keep the inline path.

Unit tests on the memory broker with a real worker (``drain``); what each broker stores raw is
the conformance suite's (``tests/brokers/test_sealed_storage_contract.py``).
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

import hurtle
from hurtle import ConfigurationError, Hurtle, SealError, TaskFailed, chain, chord, group
from hurtle.brokers.memory import MemoryBroker
from hurtle.ids import new_id
from hurtle.message import Message
from hurtle.records import decode
from hurtle.sealing import EXT, SEALED, is_sealed, key_id, sealed_by
from hurtle.testing import drain
from hurtle.worker.acker import Acker
from hurtle.worker.processor import Processor

SECRET = "s3cret-value"


def sealed_app(broker: MemoryBroker | None = None, *keys: bytes, **settings: Any) -> Hurtle:
    """An app whose ``vault.echo`` is encrypted and keeps results, ``vault.plain`` neither."""
    app = Hurtle(
        broker or MemoryBroker(), encryption_keys=list(keys or [os.urandom(32)]), **settings
    )

    @app.task(name="vault.echo", encrypt=True, store_result=True, retries=0)
    def echo(word: str, times: int = 1) -> str:
        return word * times

    @app.task(name="vault.plain", store_result=True, retries=0)
    def plain(x: Any) -> str:
        return f"plain:{x}"

    return app


def raw_messages(app: Hurtle, queue: str = "default") -> list[bytes]:
    broker = app.broker
    assert isinstance(broker, MemoryBroker)
    c = broker.consumer([queue])
    got = c.fetch(100, 0)
    c.release(got)
    return [d.raw for d in got]


def dead_reasons(app: Hurtle, queue: str = "default") -> list[str]:
    return [d.reason for d in app.broker.dead_letters(queue, 100, 0)]


# -- what is sealed ------------------------------------------------------------------------------


def test_a_sent_call_travels_as_one_sealed_value_with_its_key_id_in_a_header() -> None:
    app = sealed_app()
    app.tasks["vault.echo"].send(SECRET, times=2)
    (raw,) = raw_messages(app)
    assert SECRET.encode() not in raw
    m = Message.decode(raw)
    assert m.task == "vault.echo" and m.queue == "default"  # not sealed: routed and shown
    assert len(m.args) == 1 and is_sealed(m.args[0]) and m.kwargs == {}
    assert m.headers == {SEALED: app.keyring.id} and sealed_by(m.args[0]) == app.keyring.id


def test_every_way_of_sending_seals_and_the_worker_runs_the_opened_call() -> None:
    app = sealed_app()
    echo = app.tasks["vault.echo"]
    handles = [
        echo.send(SECRET),
        echo.delay(SECRET, times=2),
        echo.options(priority=5).send(SECRET),
        echo.apply_async((SECRET,), {"times": 3}),
        app.send_task("vault.echo", args=(SECRET,)),
        echo.s(SECRET).send(),
        *echo.send_many([(SECRET,), {"word": SECRET, "times": 2}, hurtle.Args(SECRET)]),
    ]
    assert all(SECRET.encode() not in raw for raw in raw_messages(app))
    drain(app)
    assert [h.result(5) for h in handles] == [
        SECRET,
        SECRET * 2,
        SECRET,
        SECRET * 3,
        SECRET,
        SECRET,
        SECRET,
        SECRET * 2,
        SECRET,
    ]
    assert handles[0].get(5) == SECRET
    assert asyncio.run(handles[1].aresult(5)) == SECRET * 2


def test_the_stored_result_and_the_arguments_it_keeps_are_sealed() -> None:
    app = sealed_app()
    h = app.tasks["vault.echo"].send(SECRET)
    drain(app)
    payload = app.broker.get_result(h.id)
    assert payload is not None and SECRET.encode() not in payload
    record = decode(payload)
    assert is_sealed(record.value) and sealed_by(record.value) == app.keyring.id
    assert record.args_kept and len(record.args) == 1 and is_sealed(record.args[0])
    assert h.result(5) == SECRET


def test_an_app_without_the_key_cannot_read_a_sealed_result() -> None:
    app = sealed_app()
    h = app.tasks["vault.echo"].send(SECRET)
    drain(app)
    for reader in (Hurtle(app.broker), Hurtle(app.broker, encryption_keys=[os.urandom(32)])):
        with pytest.raises(SealError, match=f"sealed .*{app.keyring.id}|no encryption_keys"):
            reader.handle(h.id).result(5)


def test_an_encrypted_task_s_unique_lock_is_a_keyed_hash_and_still_finds_its_duplicate() -> None:
    app = Hurtle(MemoryBroker(), encryption_keys=[os.urandom(32)])

    @app.task(name="vault.once", encrypt=True, unique_for=60)
    def once(word: str) -> str:
        return word

    first, second = once.send("ab"), once.send("ab")
    assert first.id == second.id  # the same call: one message
    (raw,) = raw_messages(app)
    lock = Message.decode(raw).unique
    assert (
        lock.startswith("vault.once:") and msgspec.msgpack.encode((("ab",), ())).hex() not in lock
    )
    assert once.send_many([("ab",), ("cd",)])[0].id == first.id


def test_a_key_function_of_a_limit_gets_the_opened_arguments() -> None:
    seen: list[Any] = []

    def by_user(user: str) -> str:
        seen.append(user)
        return user

    app = Hurtle(MemoryBroker(), encryption_keys=[os.urandom(32)])

    @app.task(name="vault.limited", encrypt=True, rate_limit="1000/s", rate_limit_key=by_user)
    def limited(user: str) -> str:
        return user

    limited.send_many([("ann",), ("bob",)])
    assert drain(app).ran == 2
    assert sorted(seen) == ["ann", "bob"]


def test_an_async_encrypted_task_runs_its_opened_call() -> None:
    app = Hurtle(MemoryBroker(), encryption_keys=[os.urandom(32)])

    @app.task(name="vault.later", encrypt=True, store_result=True)
    async def later(word: str) -> str:
        await asyncio.sleep(0)
        return word.upper()

    h = later.send("quiet")
    drain(app)
    assert h.result(5) == "QUIET"


def test_a_result_that_cannot_be_encoded_fails_its_call_as_an_unsealed_one_does() -> None:
    app = Hurtle(MemoryBroker(), encryption_keys=[os.urandom(32)])

    @app.task(name="vault.odd", encrypt=True, store_result=True, retries=0)
    def odd() -> object:
        return object()

    h = odd.send()
    drain(app)
    with pytest.raises(TaskFailed) as failed:
        h.result(5)
    assert failed.value.type == "ResultError" and "cannot be stored" in failed.value.message


# -- workflows ---------------------------------------------------------------------------------


def test_a_chain_passes_an_encrypted_task_s_result_on_sealed_whatever_the_next_task() -> None:
    app = sealed_app()
    echo, plain = app.tasks["vault.echo"], app.tasks["vault.plain"]
    into_plain = chain(echo.s(SECRET), plain.s()).send()
    into_sealed = chain(plain.s("x"), echo.s(2)).send()
    first = raw_messages(app)
    assert all(SECRET.encode() not in raw for raw in first)
    links = [Message.decode(raw) for raw in first]
    assert [m.task for m in links] == ["vault.echo", "vault.plain"]
    drain(app)
    assert into_plain.result(5) == f"plain:{SECRET}"
    assert into_sealed.result(5) == "plain:xplain:x"


def test_the_next_link_of_a_chain_is_sealed_in_the_header_and_when_published() -> None:
    app = Hurtle(MemoryBroker(), encryption_keys=[os.urandom(32)])

    @app.task(name="vault.one", encrypt=True)
    def one(x: str) -> str:
        return x + "-one"

    @app.task(name="vault.two", encrypt=True, store_result=True)
    def two(x: str, suffix: str) -> str:
        return x + suffix

    h = chain(one.s(SECRET), two.s(suffix=SECRET)).send()
    (raw,) = raw_messages(app)
    assert SECRET.encode() not in raw  # the second link's arguments travel in its header
    consumer = app.broker.consumer(["default"])
    (delivery,) = consumer.fetch(1, 0)
    worker = Processor(app, Acker(consumer), app.middleware)
    worker.process(delivery)
    worker.acker.flush()
    passed = raw_messages(app)  # the second link, published with the first's result
    assert len(passed) == 1 and SECRET.encode() not in passed[0]
    assert Message.decode(passed[0]).headers[SEALED] == app.keyring.id
    drain(app)
    assert h.result(5) == f"{SECRET}-one{SECRET}"


def test_a_chord_s_callback_gets_its_members_results_opened() -> None:
    app = sealed_app()
    echo, plain = app.tasks["vault.echo"], app.tasks["vault.plain"]

    @app.task(name="vault.join", encrypt=True, store_result=True)
    def join(parts: list[str], sep: str) -> str:
        return sep.join(parts)

    @app.task(name="plain.count", store_result=True)
    def count(parts: list[str]) -> int:
        return len(parts)

    sealed_callback = chord([echo.s(SECRET), plain.s(1)], join.s("|")).send()
    plain_callback = chord([echo.s(SECRET), echo.s("b")], count.s()).send()
    empty = chord([], join.s("|")).send()
    together = group(echo.s(SECRET), echo.s("b", 2)).send()
    assert all(SECRET.encode() not in raw for raw in raw_messages(app))
    drain(app)
    assert sealed_callback.result(5) == f"{SECRET}|plain:1"
    assert plain_callback.result(5) == 2
    assert empty.result(5) == ""
    assert together.result(5) == [SECRET, "bb"]


# -- rotation, and what cannot be opened ---------------------------------------------------------


def test_key_rotation_opens_what_the_old_key_sealed_and_seals_with_the_new_one() -> None:
    broker = MemoryBroker()
    old, new = os.urandom(32), os.urandom(32)
    before = sealed_app(broker, old)
    h = before.tasks["vault.echo"].send(SECRET)
    after = sealed_app(broker, new, old)  # the new key first, the old one kept after it
    drain(after)
    assert after.handle(h.id).result(5) == SECRET
    record = decode(broker.get_result(h.id) or b"")
    assert sealed_by(record.value) == key_id(new).hex() == after.keyring.id
    with pytest.raises(SealError, match=key_id(new).hex()):
        before.handle(h.id).result(5)  # only the old key: not what the new one sealed
    assert sealed_by(before.tasks["vault.echo"].message((SECRET,), {}).args[0]) == key_id(old).hex()
    assert sealed_by(after.tasks["vault.echo"].message((SECRET,), {}).args[0]) == key_id(new).hex()


def test_a_message_sealed_with_a_key_the_worker_lacks_is_a_dead_letter_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = MemoryBroker()
    sender, worker = sealed_app(broker), sealed_app(broker)
    lost = sender.tasks["vault.echo"].send(SECRET)
    fine = worker.tasks["vault.echo"].send("ok")
    also = worker.tasks["vault.plain"].send(1)
    summary = drain(worker)
    assert summary.dead == 1
    assert fine.result(5) == "ok" and also.result(5) == "plain:1"
    (reason,) = dead_reasons(worker)
    assert f"sealed with key {sender.keyring.id}" in reason
    assert worker.keyring.id in reason and "HURTLE_ENCRYPTION_KEYS" in reason
    with pytest.raises(TaskFailed) as failed:
        sender.handle(lost.id).result(5)
    assert failed.value.type == "SealError"
    assert f"sealed with key {sender.keyring.id}" in failed.value.message


def test_tampered_sealed_arguments_are_a_dead_letter_saying_so() -> None:
    app = sealed_app()
    m = app.tasks["vault.echo"].message((SECRET,), {})
    data = bytearray(m.args[0].data)
    data[-1] ^= 1
    forged = msgspec.structs.replace(m, args=(msgspec.msgpack.Ext(EXT, bytes(data)),))
    app.broker.publish([forged])
    assert drain(app).dead == 1
    (reason,) = dead_reasons(app)
    assert "does not open" in reason and "tampered with" in reason


def test_sealed_arguments_moved_to_another_task_do_not_open() -> None:
    app = sealed_app()

    @app.task(name="vault.other", encrypt=True)
    def other(word: str) -> str:
        return word

    sealed = app.tasks["vault.echo"].message((SECRET,), {})
    app.broker.publish([msgspec.structs.replace(sealed, id=new_id(), task="vault.other")])
    assert drain(app).dead == 1
    assert "sealed for another task" in dead_reasons(app)[0]


def test_an_encrypted_task_refuses_arguments_that_are_not_sealed() -> None:
    app = sealed_app()
    keyless = Hurtle(app.broker)
    keyless.send_task("vault.echo", args=(SECRET,))  # a sender that does not seal
    with_headers = msgspec.structs.replace(
        Message(new_id(), "vault.echo", "default", (SECRET,)), headers={"trace": "1"}
    )
    app.broker.publish([with_headers])
    assert drain(app).dead == 2
    assert all("not sealed" in r for r in dead_reasons(app))


def test_a_worker_without_keys_dead_letters_sealed_calls_of_a_task_it_does_not_seal() -> None:
    sender = sealed_app()
    worker = Hurtle(sender.broker)
    ran: list[Any] = []
    worker.task(name="vault.echo", store_result=True, retries=0)(ran.append)
    h = sender.tasks["vault.echo"].send(SECRET)
    assert drain(worker).dead == 1
    assert ran == []  # never called with the sealed value
    assert "this app has no encryption_keys" in dead_reasons(worker)[0]
    with pytest.raises(TaskFailed, match="no encryption_keys"):
        sender.handle(h.id).result(5)


def test_a_worker_with_the_key_opens_sealed_calls_of_a_task_it_does_not_seal() -> None:
    sender = sealed_app()
    worker = Hurtle(sender.broker, encryption_keys=list(sender.settings.encryption_keys))
    ran: list[Any] = []
    worker.task(name="vault.echo", retries=0)(lambda word, times=1: ran.append((word, times)))
    sender.tasks["vault.echo"].send(SECRET, times=2)
    assert drain(worker).ran == 1
    assert ran == [(SECRET, 2)]


def test_sealed_arguments_that_do_not_fit_the_task_are_a_dead_letter_naming_the_signature() -> None:
    app = sealed_app()
    keyring = app.keyring
    assert keyring is not None
    app.broker.publish(
        [keyring.seal_message(Message(new_id(), "vault.echo", "default", (1, 2, 3)))]
    )
    assert drain(app).dead == 1
    assert "cannot be called with the arguments" in dead_reasons(app)[0]


# -- the inline path -----------------------------------------------------------------------------


def test_the_worker_calls_encrypted_tasks_inline_and_plain_ones_as_they_were() -> None:
    app = sealed_app()

    @app.task(name="vault.quick", encrypt=True)
    def quick(x: int) -> int:
        return x

    @app.task(name="plain.quick")
    def plain_quick(x: int) -> int:
        return x

    processor = Processor(app, Acker(app.broker.consumer(["default"])), app.middleware)
    assert plain_quick.run is plain_quick.fn  # no wrapper, no branch: what it always was
    assert quick.run is not quick.fn  # what opens its arguments, chosen at registration
    # neither needs a Job per message: called in the batch loop, with or without results
    assert {"vault.quick", "plain.quick"} <= set(processor._inline)
    assert {"vault.echo", "vault.plain"} <= set(processor._called)


# -- settings ------------------------------------------------------------------------------------


def test_keys_come_from_the_environment_as_base64_text_and_are_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    new, old = hurtle.new_key(), base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    monkeypatch.setenv("HURTLE_ENCRYPTION_KEYS", f"{new}, {old}")
    monkeypatch.setenv("HURTLE_ENCRYPT", "1")
    app = Hurtle("memory://")
    assert len(app.settings.encryption_keys) == 2 and app.settings.encrypt
    assert app.keyring is not None and app.keyring.id == key_id(base64.urlsafe_b64decode(new)).hex()
    assert new not in repr(app.settings) and new not in repr(app.keyring)

    @app.task(name="vault.default")
    def default(x: int) -> int:
        return x

    @app.task(name="vault.open", encrypt=False)
    def in_plain(x: int) -> int:
        return x

    assert default.encrypt and not in_plain.encrypt
    assert is_sealed(default.message((1,), {}).args[0])
    assert in_plain.message((1,), {}).args == (1,)


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ("k", "must be a list of keys"),
        ([], "is empty"),
        ([b"short"], "key 1 of encryption_keys is 5 bytes, not 32"),
        ([os.urandom(32), "not base64!"], "key 2 of encryption_keys is not URL-safe base64"),
        ([42], "must be 32 bytes or their URL-safe base64 text, got int"),
    ],
)
def test_a_bad_key_is_refused_naming_its_place_never_its_value(keys: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as refused:
        Hurtle("memory://", encryption_keys=keys)
    assert "not base64!" not in str(refused.value)


def test_a_bad_key_in_the_environment_is_refused_without_showing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leaked = base64.urlsafe_b64encode(os.urandom(16)).decode()
    monkeypatch.setenv("HURTLE_ENCRYPTION_KEYS", leaked)
    with pytest.raises(ConfigurationError, match="HURTLE_ENCRYPTION_KEYS: key 1") as refused:
        Hurtle("memory://")
    assert leaked not in str(refused.value)


def test_sealing_without_keys_is_refused_where_it_is_asked_for() -> None:
    with pytest.raises(ConfigurationError, match="encrypt=True: sealing every task needs"):
        Hurtle("memory://", encrypt=True)
    app = Hurtle("memory://")
    with pytest.raises(ConfigurationError, match=r"'vault\.x': encrypt=True needs the app's"):
        app.task(name="vault.x", encrypt=True)(lambda: None)
    with pytest.raises(ConfigurationError, match="encrypt must be True or False"):
        Hurtle("memory://", encryption_keys=[os.urandom(32)]).task(name="x", encrypt=1)(
            lambda: None
        )


def test_every_new_key_is_a_key() -> None:
    keys: list[Callable[[], Any]] = [hurtle.new_key, lambda: os.urandom(32)]
    for make in keys:
        app = Hurtle("memory://", encryption_keys=[make()])
        assert app.keyring is not None


def test_no_two_sealed_calls_share_a_nonce_across_batches_and_single_sends() -> None:
    app = sealed_app()
    echo = app.tasks["vault.echo"]
    for _ in range(3):  # sealed as each batch builds its messages, one after a single send
        echo.send_many([(SECRET, i) for i in range(150)])
    echo.send(SECRET)
    broker = app.broker
    assert isinstance(broker, MemoryBroker)
    c = broker.consumer(["default"])
    got = c.fetch(1000, 0)
    c.release(got)
    nonces = [bytes(Message.decode(d.raw).args[0].data)[5:17] for d in got]
    assert len(nonces) == 451 and len(set(nonces)) == 451
    assert drain(app).ran == 451  # and every one of them opens
