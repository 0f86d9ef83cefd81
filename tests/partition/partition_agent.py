"""The test's hands on a host of its network: a process started inside a namespace
(``python partition_agent.py``) that reads one JSON request a line on stdin and answers one
JSON line on stdout. The test, outside every namespace, reaches Redis and the dashboards through
it.

Requests (``op`` and its fields), answered with ``{"ok": ...}`` or ``{"error": "..."}``:

* ``ping``: Redis answers (``HURTLE_BROKER_URL``).
* ``stream`` (``total``, ``chunk``, ``pause``, ``seconds``, ``log``): publish the calls
  ``partition.work(n, seconds)`` for n in ``range(total)``, ``chunk`` at a time with ``pause``
  seconds between, on a thread; each published number is appended to ``log`` as
  ``sent <n> <message id>`` once its ``send_many`` returned, or ``unsure <n>`` if it raised.
* ``held``: per worker (by pid) of queue ``default``, what the broker counts as held by it:
  the task numbers of its ``partition.work`` messages and the ids of the others (ticks); and
  whether its deadline has not passed (all read in one script).
* ``workers``: the live workers' pids, with the time of their last report.
* ``stats``: the queue's ``ready``, ``delayed`` and ``in_flight``.
* ``results`` (``ids``): per message id, the value stored for it, or ``null``.
* ``get`` (``url``, ``limit``): an HTTP GET that waits at most ``limit`` seconds: its status
  (0: no answer in time, or none at all), body and how long it took.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from hurtle import Hurtle
from hurtle.brokers.keys import queue_keys
from hurtle.errors import HurtleError
from hurtle.message import Message

#: Every unsettled payload of every worker of one queue, with each worker's deadline and the
#: server's time: {worker id, deadline, payload...} per worker, then the time.
HELD = """
local out = {}
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local workers = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for w = 1, #workers, 2 do
  local index = KEYS[2] .. workers[w]
  local entry = { workers[w], workers[w + 1] }
  local flat = redis.call('HGETALL', index)
  for i = 1, #flat, 2 do
    local key = index .. ':' .. flat[i]
    local items = redis.call('LRANGE', key, 0, -1)
    local done = redis.call('GET', key .. ':done') or ''
    for j = 1, #items do
      local byte = string.byte(done, math.floor((j - 1) / 8) + 1) or 0
      if math.floor(byte / 2 ^ (7 - (j - 1) % 8)) % 2 == 0 then
        entry[#entry + 1] = items[j]
      end
    end
  end
  out[#out + 1] = entry
end
out[#out + 1] = tostring(now)
return out
"""

app = Hurtle()  # HURTLE_BROKER_URL
work = app.task(name="partition.work", retries=0)(lambda n, seconds: None)


def stream(total: int, chunk: int, pause: float, seconds: float, log: str) -> None:
    for start in range(0, total, chunk):
        numbers = range(start, min(start + chunk, total))
        try:
            handles = work.send_many([(n, seconds) for n in numbers])
        except HurtleError:
            lines = [f"unsure {n}" for n in numbers]
        else:
            lines = [f"sent {n} {h.id}" for n, h in zip(numbers, handles, strict=True)]
        with open(log, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        time.sleep(pause)


def held() -> dict[str, Any]:
    k = queue_keys("default")
    client: Any = app.broker._client  # type: ignore[attr-defined]
    *entries, now = client.eval(HELD, 2, k.workers, k.inflight_prefix)
    out = {}
    for worker_id, deadline, *payloads in entries:
        pid = worker_id.decode().split(":")[1]
        messages = [Message.decode(p) for p in payloads]
        numbers = [m.args[0] for m in messages if m.task == work.name]
        others = [m.id for m in messages if m.task != work.name]
        out[pid] = {"numbers": numbers, "others": others, "alive": float(deadline) > float(now)}
    return out


def get(url: str, timeout: float) -> dict[str, Any]:
    began = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    except OSError as err:  # refused, or no answer within the timeout
        status, body = 0, f"{type(err).__name__}: {err}"
    return {"status": status, "body": body, "elapsed": time.monotonic() - began}


def handle(request: dict[str, Any]) -> Any:
    op = request["op"]
    if op == "ping":
        app.broker.stats(["default"])
        return True
    if op == "stream":
        args = (request["total"], request["chunk"], request["pause"], request["seconds"])
        threading.Thread(target=stream, args=(*args, request["log"]), daemon=True).start()
        return True
    if op == "held":
        return held()
    if op == "workers":
        return {str(r.pid): r.at for r in app.broker.workers()}
    if op == "stats":
        s = app.broker.stats(["default"])["default"]
        return {"ready": s.ready, "delayed": s.delayed, "in_flight": s.in_flight}
    if op == "results":
        values = {}
        for id in request["ids"]:
            payload = app.broker.get_result(id)
            values[id] = None if payload is None else app.handle(id).result(timeout=1)
        return values
    if op == "get":
        return get(request["url"], request["limit"])
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        try:
            answer = {"ok": handle(json.loads(line))}
        except Exception as err:
            answer = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    os._exit(0)  # the stream's thread, if any, ends with the process


if __name__ == "__main__":
    main()
