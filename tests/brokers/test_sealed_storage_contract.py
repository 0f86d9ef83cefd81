"""What a broker stores of an encrypted task never holds its arguments or results in plain text.

Calls of encrypted tasks carrying a recognisable secret are sent every way (``send`` with
keywords, ``send_many``, a chain, a chord, a ``unique_for`` task, a call that fails and becomes a
dead letter), run by a real worker, their results stored and read back; then one more waits in
its queue, one is delayed, and a unique lock is held. Then every byte the broker keeps is read
raw — Redis: ``DUMP`` and the value of every key; SQLite: every row of every table and the
files; NATS: every message (subject, headers, data) of every stream, KV buckets included; memory:
every bytes and str reachable from the broker — and the secret is in none of it, nor its hex.
A plain task's call with another marker is sent beside them: the same scan finds that one, so
the scan reads what the broker stores.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import msgspec

from hurtle import Hurtle, TaskFailed, chain, chord
from hurtle.ids import new_id
from hurtle.testing import drain


def test_no_byte_the_broker_keeps_holds_an_encrypted_task_s_arguments_or_results(
    broker_url: str,
) -> None:
    secret = f"s3cret-{new_id()}"
    control = f"in-plain-{new_id()}"
    app = Hurtle(broker_url, encryption_keys=[os.urandom(32)], heartbeat_timeout=5.0)

    @app.task(name="vault.echo", encrypt=True, store_result=True)
    def echo(word: str, *, suffix: str = "") -> dict[str, str]:
        return {"echo": word + suffix}

    @app.task(name="vault.same", encrypt=True, store_result=True)
    def same(x: Any) -> Any:
        return x

    @app.task(name="vault.count", encrypt=True, store_result=True)
    def count(xs: list[str]) -> int:
        return sum(x.count(secret) for x in xs)

    @app.task(name="vault.fail", encrypt=True, store_result=True, retries=0)
    def fail(word: str) -> None:
        raise ValueError("refused")  # (an error's own text is not sealed: it names no secret)

    @app.task(name="vault.once", encrypt=True, store_result=True, unique_for=3600)
    def once(word: str) -> str:
        return word

    @app.task(name="vault.plain", store_result=True)
    def plain(word: str) -> str:
        return word

    try:
        sent = echo.send(secret, suffix=secret)
        many = echo.send_many([(secret,), {"word": secret}])
        linked = chain(same.s(secret), same.s()).send()
        gathered = chord([same.s(secret), same.s(secret)], count.s()).send()
        failed = fail.send(secret)
        unique = once.send(secret)
        shown = plain.send(control)
        summary = drain(app, timeout=60)
        assert summary.dead == 1, summary
        assert sent.result(10) == {"echo": secret + secret}
        assert [h.result(10) for h in many] == [{"echo": secret}, {"echo": secret}]
        assert linked.result(10) == secret
        assert gathered.result(10) == 2
        assert unique.result(10) == secret
        assert shown.result(10) == control
        try:
            failed.result(10)
        except TaskFailed as err:
            assert err.type == "ValueError"
        else:
            raise AssertionError("vault.fail succeeded")
        # left in the broker: a call waiting, a delayed one, a unique lock held
        echo.send(secret)
        echo.options(delay=3600).send(secret)
        once.send(secret + "!")

        stored = list(raw_bytes(app, broker_url))
        assert any(control.encode() in b for b in stored), "the scan does not see what is stored"
        for needle in (secret.encode(), secret.encode().hex().encode()):
            leaks = [b[:200] for b in stored if needle in b]
            assert not leaks, leaks
    finally:
        app.close()


def raw_bytes(app: Hurtle, url: str) -> Iterator[bytes]:
    """Every byte string the broker at ``url`` keeps, read under the broker, not through it."""
    scheme = urlparse(url).scheme
    if scheme == "memory":
        yield from _reachable(app.broker)
    elif scheme == "sqlite":
        yield from _sqlite(Path(url.removeprefix("sqlite:///")))
    elif scheme.startswith("redis"):
        yield from _redis(url)
    elif scheme == "nats":
        yield from asyncio.run(_nats(url))
    elif scheme in ("postgresql", "postgres"):
        yield from _postgres(url)
    else:
        raise AssertionError(f"no raw reader for {url}")


def _reachable(root: object) -> Iterator[bytes]:
    """Every bytes and str reachable from ``root``'s attributes and containers (as UTF-8)."""
    seen: set[int] = set()
    todo: collections.deque[object] = collections.deque([root])
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, bytes | bytearray | memoryview):
            yield bytes(obj)
        elif isinstance(obj, str):
            yield obj.encode("utf-8", "surrogatepass")
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset | collections.deque):
            todo.extend(obj)
        elif isinstance(obj, msgspec.msgpack.Ext):
            todo.append(obj.data)
        elif isinstance(obj, msgspec.Struct):
            todo.extend(getattr(obj, f) for f in obj.__struct_fields__)
        elif type(obj).__module__.startswith("hurtle."):
            todo.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    todo.append(getattr(obj, name))


def _sqlite(path: Path) -> Iterator[bytes]:
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert tables
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes):
                        yield value
                    elif value is not None:
                        yield str(value).encode()
    for file in path.parent.glob(path.name + "*"):  # the file, its WAL and shared memory
        yield file.read_bytes()


def _postgres(url: str) -> Iterator[bytes]:
    """Every value of every row of every table in the broker's schema."""
    import psycopg

    query = dict(p.split("=", 1) for p in urlparse(url).query.split("&") if "=" in p)
    schema = query.get("schema", "hurtle")
    with psycopg.connect(url.split("?", 1)[0]) as db:
        tables = [
            r[0]
            for r in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        ]
        assert tables
        for table in tables:
            for row in db.execute(f'SELECT * FROM "{schema}"."{table}"'):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        yield bytes(value)
                    elif isinstance(value, list):
                        yield repr(value).encode()
                        yield from (bytes(v) for v in value if isinstance(v, bytes | memoryview))
                    elif value is not None:
                        yield str(value).encode()


def _redis(url: str) -> Iterator[bytes]:
    import redis

    if "+cluster" in url:
        parsed = urlparse(url)
        client: Any = redis.RedisCluster(host=parsed.hostname, port=parsed.port)
    else:
        client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter())
        assert keys
        for key in keys:
            yield key
            dumped = client.dump(key)
            if dumped is not None:
                yield dumped  # (may be compressed: the values are read too)
            kind = client.type(key).decode()
            if kind == "string":
                yield client.get(key) or b""
            elif kind == "hash":
                for field, value in client.hgetall(key).items():
                    yield field + b"\x00" + value
            elif kind == "list":
                yield from client.lrange(key, 0, -1)
            elif kind == "set":
                yield from client.smembers(key)
            elif kind == "zset":
                yield from client.zrange(key, 0, -1)
            elif kind == "stream":
                for _, fields in client.xrange(key):
                    for field, value in fields.items():
                        yield field + b"\x00" + value
            else:
                raise AssertionError(f"no reader for {kind} {key!r}")
    finally:
        client.close()


async def _nats(url: str) -> list[bytes]:
    import nats
    from nats.js.errors import NotFoundError

    out: list[bytes] = []
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        streams = await js.streams_info()
        assert streams
        for info in streams:
            name = info.config.name
            out.append(name.encode())
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(name, seq)
                except NotFoundError:  # deleted since
                    continue
                out.append(msg.subject.encode())
                out.append(msg.data or b"")
                for key, value in (msg.headers or {}).items():
                    out.append(f"{key}: {value}".encode())
    finally:
        await nc.close()
    return out
