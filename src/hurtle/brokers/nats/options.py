"""What a NATS broker URL says: the servers, how to connect to them, and hurtle's own options.

``nats://[user:password@]host[:port][,host[:port]...][?option=value&...]``, or ``tls://`` for a
connection that must be encrypted. Several servers of one cluster may be listed, separated by
commas: the client connects to one of them and moves to another when it is lost (it also
learns the others from the server it reaches, unless the cluster hides them).

Options (the query string):

* ``replicas=N`` — copies of each stream and KV bucket hurtle makes (1 to 5); by default as
  many as the cluster has servers, at most 3 (``default_replicas``);
* ``tls_ca=PATH`` — the CA file the server's certificate is checked against (default: the
  system's CAs); ``tls_cert=PATH`` and ``tls_key=PATH`` — the client's certificate and its key,
  for a server that verifies clients; ``tls_hostname=NAME`` — the name the server's certificate
  must carry (default: the host of the URL). Any of them asks for TLS, as ``tls://`` does;
* ``creds=PATH`` — a ``.creds`` file (a user JWT and its nkey seed, as ``nsc`` writes it);
  ``nkey=PATH`` — a file holding a user's nkey seed (``SU…``). Both need the ``nkeys`` package
  (``pip install "hurtle[nats]"`` brings it).

A file that an option names must exist when the broker is made: a ``ConfigurationError`` says
which one does not.
"""

from __future__ import annotations

import importlib.util
import os
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import ConfigurationError

#: Most copies JetStream keeps of a stream.
MAX_REPLICAS = 5
#: Most copies hurtle asks for unless told: three survive the loss of one server, and more
#: only slow every write down.
DEFAULT_MAX_REPLICAS = 3
#: The first nats-server 2.9 whose compare-and-set on a replicated KV bucket lets one writer
#: win: before it, concurrent updates on the revision read can all succeed.
CAS_FIXED = (2, 9, 21)

_FILES = ("tls_ca", "tls_cert", "tls_key", "creds", "nkey")
_OPTIONS = (*_FILES, "tls_hostname", "replicas")


@dataclass(frozen=True)
class NatsOptions:
    """A NATS broker URL, parsed."""

    #: The URL without its password and query, for messages and ``Broker.url``.
    url: str
    #: Server URLs for nats-py (``nats://host:port`` or ``tls://host:port``).
    servers: list[str]
    #: ``replicas=`` as given, or None for the cluster's default.
    replicas: int | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    creds: str | None = None
    nkey: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of nats-py's ``connect`` for authentication and TLS."""
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
            options["password"] = self.password or ""
        if self.tls:
            options["tls"] = self.ssl_context()
            if self.tls_hostname:
                options["tls_hostname"] = self.tls_hostname
        if self.creds:
            options["user_credentials"] = self.creds
        if self.nkey:
            options["nkeys_seed"] = self.nkey
        return options

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            try:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, OSError) as err:
                raise ConfigurationError(
                    f"bad NATS URL {self.url!r}: cannot load the client certificate "
                    f"tls_cert={self.tls_cert!r} with tls_key={self.tls_key!r}: {err}; give a PEM "
                    "certificate and the PEM key it was made for"
                ) from err
        return context


def parse(url: str) -> NatsOptions:
    """The options of ``url``; a ``ConfigurationError`` naming what is wrong with it."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if scheme not in ("nats", "tls") or not hosts:
        raise ConfigurationError(
            f"a NATS broker URL is nats://host:port or tls://host:port, got {_public(url)!r}"
        )
    addresses = [_address(h, url) for h in hosts.split(",")]
    public = f"{scheme}://{','.join(addresses)}{parts.path}"
    given: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _OPTIONS:
            raise ConfigurationError(
                f"bad NATS URL {public!r}: unknown option {name!r}; the options are "
                + ", ".join(_OPTIONS)
            )
        given[name] = value
    for name in _FILES:
        if name in given and not os.path.isfile(given[name]):
            raise ConfigurationError(
                f"bad NATS URL {public!r}: {name}={given[name]!r} is not a file"
            )
    if ("tls_key" in given) != ("tls_cert" in given):
        raise ConfigurationError(
            f"bad NATS URL {public!r}: tls_cert and tls_key go together (the client's "
            "certificate and its key)"
        )
    replicas = None
    if "replicas" in given:
        try:
            replicas = int(given["replicas"])
            if not 1 <= replicas <= MAX_REPLICAS:
                raise ValueError(replicas)
        except ValueError:
            raise ConfigurationError(
                f"bad NATS URL {public!r}: replicas={given['replicas']!r}; it is a number of "
                f"copies from 1 to {MAX_REPLICAS}"
            ) from None
    # nats-py signs with the nkeys package
    if ("creds" in given or "nkey" in given) and importlib.util.find_spec("nkeys") is None:
        raise ConfigurationError(
            f"bad NATS URL {public!r}: creds and nkey need the nkeys package: "
            "pip install 'hurtle[nats]'"
        )
    tls = scheme == "tls" or any(name.startswith("tls_") for name in given)
    user, _, password = userinfo.partition(":")
    return NatsOptions(
        url=public,
        servers=[f"{'tls' if tls else 'nats'}://{a}" for a in addresses],
        replicas=replicas,
        tls=tls,
        tls_ca=given.get("tls_ca"),
        tls_cert=given.get("tls_cert"),
        tls_key=given.get("tls_key"),
        tls_hostname=given.get("tls_hostname"),
        creds=given.get("creds"),
        nkey=given.get("nkey"),
        user=unquote(user) if userinfo else None,
        password=unquote(password) if userinfo else None,
    )


def default_replicas(server_info: dict[str, Any], servers: int) -> int:
    """Replicas when the URL names none: 1 on a server that is not in a cluster, else as many
    as the cluster has servers (those the server advertises to clients, or those the URL
    lists), at most ``DEFAULT_MAX_REPLICAS``."""
    if not server_info.get("cluster"):
        return 1
    known = len(set(server_info.get("connect_urls") or ()))
    return max(1, min(DEFAULT_MAX_REPLICAS, max(known, servers)))


def version(server_info: dict[str, Any]) -> tuple[int, ...]:
    """The server's version as numbers (``2.9.10`` -> ``(2, 9, 10)``), ``()`` if unknown."""
    text = str(server_info.get("version") or "").split("-")[0]
    try:
        return tuple(int(n) for n in text.split("."))
    except ValueError:
        return ()


def cas_unsafe(server_info: dict[str, Any], replicas: int) -> bool:
    """Whether compare-and-set on buckets of ``replicas`` copies can let two writers win on
    this server (nats-server before 2.9.21; the fix is in every 2.10)."""
    found = version(server_info)
    return replicas > 1 and bool(found) and found < CAS_FIXED


def _address(host: str, url: str) -> str:
    """``host[:port]``, checked."""
    name, _, port = host.strip().rpartition(":") if ":" in host else (host.strip(), "", "")
    if not name or (port and not port.isdigit()):
        raise ConfigurationError(
            f"a NATS broker URL names its servers as host:port, comma-separated; "
            f"got {host!r} in {_public(url)!r}"
        )
    return f"{name}:{port}" if port else name


def _public(url: str) -> str:
    parts = urlsplit(url)
    _, _, hosts = parts.netloc.rpartition("@")
    return f"{parts.scheme}://{hosts}{parts.path}"
