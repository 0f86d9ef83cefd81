"""The Lua scripts in ``../lua/``, read once per process, and the plumbing that runs them: one
script or a pipeline of commands in one round trip, redis-py errors turned into ``BrokerError``."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, NoReturn

from redis.exceptions import NoScriptError

import redis

from ...errors import BrokerError
from ...message import MAX_PRIORITY, Message
from ..common import lock_end
from ..keys import queue_keys

_PRIORITIES = range(MAX_PRIORITY + 1)

#: hiredis' command packer (``_pipeline_raw``); redis-py runs without it (the ``redis`` extra
#: installs it), and then so does hurtle, through redis-py's pipeline.
_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:
    _pack = None

#: The first element of a command ``_pipeline_raw`` sends as it is: ``((RAW, resp_bytes), None)``.
RAW = object()

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)


class _Script:
    """One Lua file, run with ``EVALSHA`` (loaded again on ``NOSCRIPT``)."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = _read_lua(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()


def _read_lua(name: str) -> str:
    text = resources.files("hurtle.brokers").joinpath("lua", f"{name}.lua").read_text("utf-8")
    return _INCLUDE.sub(lambda m: _read_lua(m.group(1)), text)


class _Scripts:
    """Every script, read once per process."""

    def __init__(self) -> None:
        self.publish = _Script("publish")
        self.fetch = _Script("fetch")
        self.ack = _Script("ack")
        self.ack_results = _Script("ack_results")
        self.ack_flow = _Script("ack_flow")
        self.retry = _Script("retry")
        self.dead_letter = _Script("dead_letter")
        self.release = _Script("release")
        self.held = _Script("held")
        self.heartbeat = _Script("heartbeat")
        self.close = _Script("close")
        self.stats = _Script("stats")
        self.dead_list = _Script("dead_list")
        self.dead_delete = _Script("dead_delete")
        self.dead_index = _Script("dead_index")
        self.purge = _Script("purge")
        self.claim_tick = _Script("claim_tick")
        self.results_expire = _Script("results_expire")
        self.result_get = _Script("result_get")
        self.rate = _Script("rate")
        self.slots = _Script("slots")
        self.publish_unique = _Script("publish_unique")
        self.publish_once = _Script("publish_once")
        self.unique_release = _Script("unique_release")
        self.cancel_flag = _Script("cancel_flag")
        self.chord_count = _Script("chord_count")
        self.latest_put = _Script("latest_put")

    def all(self) -> list[_Script]:
        return [v for v in vars(self).values() if isinstance(v, _Script)]


_scripts: _Scripts | None = None


def _get_scripts() -> _Scripts:
    global _scripts
    if _scripts is None:
        _scripts = _Scripts()
    return _scripts


# One command of a pipeline: (args of execute_command, script or None).
_Command = tuple[tuple[Any, ...], "_Script | None"]


class _ScriptRunner:
    """What ``RedisBroker`` is built on: its connection and how commands run on it."""

    url: str
    # Typed ``Any``: redis-py's command methods carry no annotations.
    _client: Any

    # -- plumbing ---------------------------------------------------------------------------

    def _fail(self, err: redis.RedisError, doing: str) -> NoReturn:
        if isinstance(err, redis.AuthenticationError):
            raise BrokerError(
                f"Redis at {self.url} refused the credentials while {doing}: {err}; check the "
                "user and password in the broker URL"
            ) from err
        if isinstance(err, redis.ConnectionError):
            raise BrokerError(
                f"cannot reach Redis at {self.url} while {doing}: {err}; is redis-server "
                "running there?"
            ) from err
        if isinstance(err, redis.TimeoutError):
            raise BrokerError(
                f"Redis at {self.url} did not answer in time while {doing}: {err}"
            ) from err
        raise BrokerError(f"Redis at {self.url} failed while {doing}: {err}") from err

    def _eval(self, script: _Script, keys: Sequence[str], args: Sequence[Any], doing: str) -> Any:
        """Run one script in one round trip (two more if the server forgot the script)."""
        client = self._client
        try:
            try:
                return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                client.script_load(script.source)
                return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.RedisError as err:
            self._fail(err, doing)

    def _pipeline(self, commands: list[_Command], doing: str) -> list[Any]:
        """Run commands in one round trip; scripts the server forgot are loaded and rerun."""
        if len(commands) == 1:
            cmd, script = commands[0]
            if script is not None:
                return [self._eval(script, cmd[3 : 3 + cmd[2]], cmd[3 + cmd[2] :], doing)]
            try:
                return [self._client.execute_command(*cmd)]
            except redis.RedisError as err:
                self._fail(err, doing)
        try:
            pipe = self._client.pipeline(transaction=False)
            for cmd, _ in commands:
                pipe.execute_command(*cmd)
            results: list[Any] = pipe.execute(raise_on_error=False)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:  # the server restarted or SCRIPT FLUSH: those commands did not run
                # a WAIT covers the writes of its own connection: it goes again after them
                missing += [i for i, (c, _) in enumerate(commands) if c[0] == "WAIT"]
                for script in {id(s): s for _, s in commands if s is not None}.values():
                    self._client.script_load(script.source)
                pipe = self._client.pipeline(transaction=False)
                for i in missing:
                    pipe.execute_command(*commands[i][0])
                for i, r in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                    results[i] = r
        except redis.RedisError as err:
            self._fail(err, doing)
        for r in results:
            if isinstance(r, redis.RedisError):
                self._fail(r, doing)
        return results

    @property
    def _raw_ok(self) -> bool:
        """Whether ``_pipeline_raw`` sends commands itself (one server, hiredis installed):
        then a command may also come packed already, as ``(RAW, bytes)``."""
        return (
            _pack is not None
            and getattr(self._client, "connection_pool", None) is not None
            and not getattr(self, "_sharded", False)
        )

    def _pipeline_raw(self, commands: list[_Command], doing: str, retry: bool = False) -> list[Any]:
        """``_pipeline`` for the worker's hot flushes (acknowledgements, results) and for
        ``publish``: each command packed by hiredis in one call, and the replies read as they
        come, raw (no response callbacks: for scripts, ``HSET``, ``PUBLISH``). redis-py's
        pipeline turns every argument over in Python first, which for a batch of results (two
        arguments a record) costs the worker's busy thread more than the packing itself, and
        a single ``send()`` a good part of a round trip before its bytes leave (what an idle
        worker waits for). ``retry``: once more on a new connection when the connection
        failed, as the clients' own pipelines do (a pooled connection that died with a
        restarted server). One server only: a cluster routes each command through
        ``_pipeline``."""
        if not self._raw_ok:
            return self._pipeline(commands, doing)
        try:
            pack = _pack
            assert pack is not None
            packed = [cmd[1] if cmd[0] is RAW else pack(cmd) for cmd, _ in commands]
        except TypeError as err:  # an argument hiredis cannot send: what redis-py says of it
            raise BrokerError(f"{doing}: {err}") from err
        results = self._send_packed(packed, doing, retry)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:  # the server restarted or SCRIPT FLUSH: those commands did not run
            try:
                for script in {id(s): s for _, s in commands if s is not None}.values():
                    self._client.script_load(script.source)
            except redis.RedisError as err:
                self._fail(err, doing)
            again = self._send_packed([packed[i] for i in missing], doing, retry)
            for i, r in zip(missing, again, strict=True):
                results[i] = r
        for r in results:
            if isinstance(r, redis.RedisError):
                self._fail(r, doing)
        return results

    def _send_packed(
        self, packed: list[bytes], doing: str, retry: bool = False, pool: Any = None
    ) -> list[Any]:
        """Send commands packed already, in one send, and read their replies raw (a command's
        error is its reply), on a connection of ``pool`` (the client's by default);
        ``retry``: once more, on a new connection, if the connection failed
        (``redis.ConnectionError``; a timeout is not retried: the commands may have run)."""
        if pool is None:
            pool = self._client.connection_pool
        data = b"".join(packed)
        while True:
            try:
                conn = pool.get_connection()
            except redis.RedisError as err:
                self._fail(err, doing)
            results: list[Any] = []
            try:
                conn.send_packed_command([data])  # one send: one wait for the GIL after
                for _ in packed:
                    try:
                        results.append(conn.read_response())
                    except redis.ResponseError as err:  # that command's error: read on
                        results.append(err)
            except BaseException as err:
                conn.disconnect()  # replies half read: the connection cannot be reused
                pool.release(conn)
                if retry and isinstance(err, redis.ConnectionError):
                    retry = False
                    continue
                if isinstance(err, redis.RedisError):
                    self._fail(err, doing)
                raise
            pool.release(conn)
            return results

    def _call(self, script: _Script, keys: Sequence[str | bytes], args: Sequence[Any]) -> _Command:
        return ("EVALSHA", script.sha, len(keys), *keys, *args), script

    def _call_whole(
        self, script: _Script, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> _Command:
        """``_call`` with the script's source (``EVAL``): it runs even when the server forgot
        its scripts, in its place in the pipeline, where ``EVALSHA`` would fail there and run
        again only after the commands behind it. For a short script that must run before the
        commands it precedes (``results_expire``), once per batch."""
        return ("EVAL", script.source, len(keys), *keys, *args), None


_PRIORITY_ARG = {p: str(p) for p in _PRIORITIES}


def _publish_keys(name: str) -> tuple[str, ...]:
    k = queue_keys(name)
    return (*k.ready, k.delayed, k.wake, k.seq)


def _packed(texts: list[str]) -> tuple[Sequence[str | bytes], bytes]:
    """``texts`` (or their UTF-8 bytes, so that their ``len`` counts bytes) and their bytes,
    concatenated: one encode for the lot when they are ASCII (ids and keys mostly are)."""
    joined = "".join(texts)
    if joined.isascii():
        return texts, joined.encode()
    encoded = [t.encode() for t in texts]
    return encoded, b"".join(encoded)


def _lock_end(message: Message) -> str:
    """When the unique lock of ``message`` ends (``common.lock_end``), as ``publish_unique.lua``
    takes it: "" when the message does not say (the script counts from the server's now)."""
    until = lock_end(message, 0.0, math.nan)
    return "" if math.isnan(until) else f"{until:.3f}"
