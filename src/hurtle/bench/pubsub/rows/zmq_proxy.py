"""Row ``zmq-proxy``: pyzmq PUSH to a ``zmq.proxy`` PULL→PUB process of its own, SUB from it;
skipped without pyzmq. A SUB socket drops silently what it cannot take."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...harness.servers import free_port
from ..loop import Client, Counter, Setup, ready_and_wait


def proxy(pull_address: str, pub_address: str) -> None:
    """The broker of the zmq row: PULL from publishers, PUB to subscribers, until killed."""
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(pull_address)
    pub = context.socket(zmq.PUB)
    pub.bind(pub_address)
    zmq.proxy(pull, pub)


@contextlib.contextmanager
def _broker() -> Iterator[dict[str, Any]]:
    addresses = {
        "zmq_in": f"tcp://127.0.0.1:{free_port()}",
        "zmq_out": f"tcp://127.0.0.1:{free_port()}",
    }
    process = multiprocessing.get_context("spawn").Process(
        target=proxy, args=(addresses["zmq_in"], addresses["zmq_out"]), daemon=True
    )
    process.start()
    try:
        yield addresses
    finally:
        process.kill()
        process.join()


def _publisher(setup: Setup) -> tuple[Callable[[int], None], Callable[[], None]]:
    import zmq

    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(setup.zmq_in)
    names = [c.encode() for c in setup.channels]
    payload = b"x" * setup.payload_size

    def publish(i: int) -> None:
        push.send_multipart((names[i], payload))

    def finish() -> None:
        push.close(linger=5000)
        context.term()

    return publish, finish


def _subscriber(setup: Setup, ready: Any, go: Any, start: Any) -> dict[str, Any]:
    import zmq

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.connect(setup.zmq_out)
    for name in setup.channels:
        sub.setsockopt(zmq.SUBSCRIBE, name.encode())
    time.sleep(0.5)  # a SUB socket has no subscription confirmation to wait for
    count = Counter(ready_and_wait(ready, go, start), setup.duration)
    n = 0
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    recv = sub.recv_multipart
    while not count.done():
        if not poller.poll(200):
            continue
        while True:
            try:
                recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            if n == 64:
                count.add(64)
                n = 0
    count.add(n)
    sub.close(linger=0)
    context.term()
    return count.report()


ROWS = [Client("zmq-proxy", _publisher, _subscriber, modules={"zmq": "pyzmq"}, broker=_broker)]
