"""NATS over TLS and with credentials: a private ``nats-server`` that speaks only TLS and
verifies client certificates (a throwaway CA made with ``openssl``, as for the Redis Cluster TLS
test), one that asks for a user and password or an nkey, and one in operator mode that takes
the user JWT of a ``.creds`` file. What works runs tasks end to end;
what is refused is one ``BrokerError`` line that says why."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import make_certificates, make_client_certificate
from hurtle import Hurtle
from hurtle.brokers import make_broker
from hurtle.errors import BrokerError, ConfigurationError
from nats_server import NatsServer, make_operator

pytest.importorskip("nats")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = make_certificates(tmp_path_factory.mktemp("nats-tls"))
    make_client_certificate(where, "client")
    stranger = where / "stranger"  # signed by a CA of its own, which the server does not trust
    stranger.mkdir()
    make_client_certificate(stranger, "client")
    return where


@pytest.fixture(scope="module")
def tls_server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    config = f"""
    tls {{
      cert_file: "{certs / "server.crt"}"
      key_file: "{certs / "server.key"}"
      ca_file: "{certs / "ca.crt"}"
      verify: true
      timeout: 5
    }}
    """
    server = NatsServer(tmp_path_factory.mktemp("nats-tls-server"), config=config)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nkey_seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A user's nkey seed in a file, and its public key."""
    nkeys = pytest.importorskip("nkeys")
    import os

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path = tmp_path_factory.mktemp("nkey") / "user.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return path, nkeys.from_seed(bytearray(seed)).public_key.decode()


@pytest.fixture(scope="module")
def auth_server(
    nkey_seed: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NatsServer]:
    config = f"""
    authorization {{
      users: [
        {{user: "alice", password: "s3cret/:@"}}
        {{nkey: "{nkey_seed[1]}"}}
      ]
    }}
    """
    server = NatsServer(tmp_path_factory.mktemp("nats-auth-server"), config=config)
    server.start()
    yield server
    server.stop()


def _tls_url(
    server: NatsServer, certs: Path, *, client: Path | None = None, ca: bool = True
) -> str:
    url = f"tls://127.0.0.1:{server.port}"
    options = []
    if ca:
        options.append(f"tls_ca={certs / 'ca.crt'}")
    if client is not None:
        options += [f"tls_cert={client / 'client.crt'}", f"tls_key={client / 'client.key'}"]
    return url + ("?" + "&".join(options) if options else "")


def _runs_tasks(url: str) -> None:
    """Tasks sent on ``url`` run on a worker of another app on it, and their results come
    back."""
    app = Hurtle(url)
    done: list[int] = []

    @app.task(name="tls.add", store_result=True)
    def add(x: int, y: int) -> int:
        done.append(x)
        return x + y

    try:
        handles = add.send_many([(i, 1) for i in range(200)])
        app.worker(burst=True).run()
        assert sorted(done) == list(range(200))
        other = Hurtle(url)
        try:
            assert other.handle(handles[199].id).result(10) == 200
        finally:
            other.close()
    finally:
        app.close()


def _refused(url: str, caplog: pytest.LogCaptureFixture) -> str:
    """The one line of the ``BrokerError`` that making a broker on ``url`` raises."""
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BrokerError) as info:
        make_broker(url)
    text = str(info.value)
    assert "\n" not in text
    assert [r for r in caplog.records if r.exc_info] == []  # no dependency's traceback
    return text


def test_tasks_and_results_run_over_tls_with_a_client_certificate(
    tls_server: NatsServer, certs: Path
) -> None:
    _runs_tasks(_tls_url(tls_server, certs, client=certs))


def test_a_client_without_a_certificate_is_refused_in_one_broker_error(
    tls_server: NatsServer, certs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(_tls_url(tls_server, certs), caplog)
    assert text.startswith(f"cannot connect to NATS at tls://127.0.0.1:{tls_server.port}: ")
    assert "tls_cert and tls_key" in text


def test_a_client_certificate_of_another_ca_is_refused_in_one_broker_error(
    tls_server: NatsServer, certs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(_tls_url(tls_server, certs, client=certs / "stranger"), caplog)
    assert text.startswith(f"cannot connect to NATS at tls://127.0.0.1:{tls_server.port}: ")
    assert "tls_cert and tls_key" in text


def test_a_server_certificate_of_an_unknown_ca_is_refused_and_tls_ca_is_named(
    tls_server: NatsServer, certs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(_tls_url(tls_server, certs, client=certs, ca=False), caplog)
    assert "certificate verify failed" in text and "tls_ca" in text


def test_a_plain_url_to_a_tls_server_is_refused_by_certificate_checks(
    tls_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(tls_server.url, caplog)
    assert "certificate" in text


def test_a_tls_url_to_a_server_without_tls_is_refused(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(f"tls://127.0.0.1:{nats_server.port}", caplog)
    assert "does not speak TLS" in text


def test_a_missing_certificate_file_is_a_configuration_error_naming_it(
    tls_server: NatsServer, certs: Path
) -> None:
    with pytest.raises(ConfigurationError, match=r"tls_ca='/nowhere/ca\.crt' is not a file"):
        make_broker(f"tls://127.0.0.1:{tls_server.port}?tls_ca=/nowhere/ca.crt")
    with pytest.raises(ConfigurationError, match="tls_cert and tls_key go together"):
        make_broker(f"tls://127.0.0.1:{tls_server.port}?tls_cert={certs / 'client.crt'}")


def test_tasks_run_with_a_user_and_password(auth_server: NatsServer) -> None:
    _runs_tasks(f"nats://alice:s3cret%2F%3A%40@127.0.0.1:{auth_server.port}")


def test_a_wrong_password_is_refused_in_one_broker_error_without_the_password(
    auth_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(f"nats://alice:wrong-one@127.0.0.1:{auth_server.port}", caplog)
    assert "Authorization Violation" in text and "wrong-one" not in text
    assert "user and password" in text


def test_tasks_run_with_an_nkey_seed(auth_server: NatsServer, nkey_seed: tuple[Path, str]) -> None:
    _runs_tasks(f"nats://127.0.0.1:{auth_server.port}?nkey={nkey_seed[0]}")


def test_an_nkey_the_server_does_not_know_is_refused_in_one_broker_error(
    auth_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nkeys = pytest.importorskip("nkeys")
    import os

    other = tmp_path / "other.nk"
    other.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    text = _refused(f"nats://127.0.0.1:{auth_server.port}?nkey={other}", caplog)
    assert "Authorization Violation" in text and "nkey" in text


def test_no_credentials_for_a_server_that_asks_for_them_is_one_broker_error(
    auth_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    text = _refused(auth_server.url, caplog)
    assert "Authorization Violation" in text


@pytest.fixture(scope="module")
def operator_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, Path]]:
    config, creds = make_operator(tmp_path_factory.mktemp("nats-operator"))
    server = NatsServer(tmp_path_factory.mktemp("nats-operator-server"), config=config)
    server.start()
    yield server, creds
    server.stop()


def test_tasks_run_with_a_creds_file(operator_server: tuple[NatsServer, Path]) -> None:
    server, creds = operator_server
    _runs_tasks(f"nats://127.0.0.1:{server.port}?creds={creds}")


def test_creds_of_an_operator_the_server_does_not_trust_are_refused_in_one_broker_error(
    operator_server: tuple[NatsServer, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = operator_server
    _, stranger = make_operator(tmp_path / "stranger")
    text = _refused(f"nats://127.0.0.1:{server.port}?creds={stranger}", caplog)
    assert "Authorization Violation" in text and "creds" in text
