"""Workers: heartbeats (and the recovery they run), reports and the cluster's counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..keys import TOTALS, WORKER_DEADLINES, WORKER_REPORT, queue_keys
from ..records import StoredResult
from ..reports import KINDS, TaskCounts, WorkerReport, decode_report, encode_report
from .flows import HEARTBEAT_FLOW_ARGS
from .scripts import _Command, _ScriptRunner, _Scripts

if TYPE_CHECKING:
    from .broker import RedisBroker
    from .consumer import RedisConsumer


class _Workers(_ScriptRunner):
    """``RedisBroker``'s side of workers."""

    max_recoveries: int
    _scripts: _Scripts
    _sharded: bool
    _dead_index: str
    _index_dead: Callable[[Sequence[Any], str], None]
    #: ``heartbeat.lua``'s record arguments; on a cluster the result prefix is ``''``: the
    #: script hands the records of what it dead-lettered back, stored by ``_fail_flows``
    _heartbeat_flow_args: tuple[Any, ...] = HEARTBEAT_FLOW_ARGS

    def workers(self) -> list[WorkerReport]:
        now = time.time()
        live = self._pipeline(
            [(("ZRANGEBYSCORE", WORKER_DEADLINES, repr(now), "+inf", "WITHSCORES"), None)],
            "reading workers' deadlines",
        )[0]
        # redis-py pairs the scores up itself (RESP2 and RESP3 alike)
        deadlines = {member.decode(): float(score) for member, score in live}
        if not deadlines:
            return []
        ids = sorted(deadlines)
        records = self._pipeline(
            [(("GET", WORKER_REPORT + worker_id), None) for worker_id in ids],
            "reading workers' reports",
        )
        out = []
        for worker_id, record in zip(ids, records, strict=True):
            report = record and decode_report(record, deadlines[worker_id])
            if report:
                out.append(report)
        return out

    def totals(self) -> list[TaskCounts]:
        raw = self._pipeline([(("HGETALL", TOTALS), None)], "reading the cluster's counters")[0]
        rows: dict[tuple[str, str], list[int]] = {}
        for field, value in raw.items():
            queue, task, kind = field.decode().split("\x1f")
            if kind in KINDS:
                rows.setdefault((queue, task), [0, 0, 0, 0])[KINDS.index(kind)] = int(value)
        return [TaskCounts(q, t, *row) for (q, t), row in sorted(rows.items())]

    def _heartbeat(
        self,
        queues: Sequence[str],
        worker_id: str,
        timeout: float,
        report: WorkerReport | None = None,
    ) -> tuple[int, bool]:
        """Push ``worker_id``'s deadline to now + ``timeout`` (unless it is ``""``) and recover
        ``queues`` from the workers whose deadline passed; store ``report``, if any, in the same
        round trip. Returns how many deliveries were recovered, and whether messages wait in
        quarantine."""
        if not queues:
            return 0, False
        commands = [] if report is None else report_commands(report, timeout)
        n_report = len(commands)
        for name in queues:
            k = queue_keys(name)
            args = (
                worker_id,
                repr(float(timeout)),
                self.max_recoveries,
                *self._heartbeat_flow_args,
                self._dead_index,
                name,
            )
            keys = (
                *k.ready,
                k.workers,
                k.wake,
                k.quarantine,
                k.deaths,
                k.probes,
                k.probe,
                k.dead,
                k.dead_raw,
                k.dead_reason,
                k.seq,
                k.inflight_prefix,
                k.unique,
            )
            commands.append(self._call(self._scripts.heartbeat, keys, args))
        doing = "recording a heartbeat and recovering"
        results = self._pipeline(commands, doing)[n_report:]
        failed = [x for r in results for x in r[2:-1]]
        if failed:
            self._fail_flows(failed)
        self._index_dead([x for r in results for x in r[-1]], doing)
        return sum(r[0] for r in results), any(r[1] for r in results)

    def _fail_flows(self, failed: list[Any]) -> None:
        """Store and announce the records (id, record, ...) of the messages a heartbeat
        dead-lettered, and of their workflows: on a cluster, where the script cannot (another
        slot). The messages are dead letters already, so a failure here (``BrokerError``) leaves
        their handles without a record: a window a cluster has and one server has not."""
        from .results import _results_commands  # here: results.py imports scripts only

        ttl = self._heartbeat_flow_args[1] / 1000
        records = [
            StoredResult(
                failed[at].decode() if isinstance(failed[at], bytes) else str(failed[at]),
                bytes(failed[at + 1]),
                ttl,
            )
            for at in range(0, len(failed), 2)
        ]
        self._pipeline(
            _results_commands(self, records),  # type: ignore[arg-type]
            "failing the workflows of dead-lettered members",
        )


def report_commands(report: WorkerReport, timeout: float) -> list[_Command]:
    """Store ``report`` until ``timeout`` seconds from now, and add its delta to the totals."""
    now = time.time()
    return [
        (
            (
                "SET",
                WORKER_REPORT + report.id,
                encode_report(report),
                "PX",
                max(int(timeout * 1000), 1),
            ),
            None,
        ),
        (("ZADD", WORKER_DEADLINES, repr(now + timeout), report.id), None),
        # dead workers' entries; their reports expire by themselves
        (("ZREMRANGEBYSCORE", WORKER_DEADLINES, "-inf", f"({now!r}"), None),
        *_total_commands(report),
    ]


def _total_commands(report: WorkerReport) -> list[_Command]:
    """What ``report`` adds to the cluster's counters."""
    return [
        (("HINCRBY", TOTALS, f"{c.queue}\x1f{c.task}\x1f{kind}", n), None)
        for c in report.delta
        for kind in KINDS
        if (n := getattr(c, kind))
    ]


def leave_commands(report: WorkerReport) -> list[_Command]:
    """A worker that stops: its last counts to the totals, its report and deadline gone."""
    return [
        *_total_commands(report),
        (("DEL", WORKER_REPORT + report.id), None),
        (("ZREM", WORKER_DEADLINES, report.id), None),
    ]


def _beat_reporting(consumer: RedisConsumer, broker: RedisBroker) -> bool:
    """``consumer``'s heartbeat through ``broker``'s connections, with its report if any."""
    with consumer._reporting() as report:
        return broker._heartbeat(
            list(consumer._targets), consumer.worker_id, consumer.heartbeat_timeout, report
        )[1]
