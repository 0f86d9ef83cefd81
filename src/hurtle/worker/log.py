"""``CallLog``: what a worker says it ran — a line per call at a low rate, a summary per interval
under load, and each failure on a line of its own.

The rule. Calls are logged one by one (``tasks.add[ID] ok in 0.8 ms: 11``) while they come at
most ``LINES_PER_SECOND`` a second on average, in bursts of up to ``BURST``: each fetched batch
takes as many lines from that allowance as it holds calls (``admit``, once per batch, in the
fetch loop). The first batch that does not fit switches the worker to summaries: no line per
call, and every ``interval`` seconds one line that counts the interval's calls per task, and how
they ended (ok, retried, dead-lettered), from the counters the worker keeps for its reports
anyway (``Tally``). After an interval whose calls averaged ``LINES_PER_SECOND`` a second or
fewer, it goes back to a line per call. A worker that stops in summary mode logs the summary of
its last, shorter interval. ``every_call`` (``--log-tasks``) logs a line per call whatever the
rate, and never summarizes. A call that fails (retried or dead-lettered) always gets its own
line, at WARNING or ERROR: failures are rare, and each one matters.

Cost. The decision is made per batch, never per call. A batch that is not logged call by call
runs exactly as it would with logging off; a logged batch gathers its calls in the columns the
processor keeps for ``after_calls`` (``Calls``: deliveries, messages, results, run times), and
its lines are written once it is settled, after its loop. A summary costs one snapshot of the
counters per interval, taken between fetches. At a log level above INFO, nothing is gathered.

Fields. Each line carries its fields (``record.fields``: task, id, queue, outcome, runtime in
seconds, attempt, and the result's short repr, the error, or the retry's delay; a summary its
interval and per-task counts), which ``--log-format json`` writes as JSON keys.
"""

from __future__ import annotations

import logging
import reprlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._text import describe, safe_str
from ..errors import Reject

if TYPE_CHECKING:
    from ..brokers.reports import Tally
    from ..message import Message
    from ..middleware import Calls, Job, Outcome

log = logging.getLogger(__name__)

#: Calls a second, on average, that a worker logs one line each for before it summarizes.
LINES_PER_SECOND = 10.0
#: How many calls it logs one by one in a burst (a batch larger than what is left switches).
BURST = 100
#: Seconds between summary lines (``hurtle worker --log-interval``).
SUMMARY_EVERY = 10.0
#: Characters of a result's repr shown in its call's line.
RESULT_CHARS = 60

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = RESULT_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6


def short_repr(value: object) -> str:
    """A repr of ``value`` of at most about ``RESULT_CHARS`` characters, built without the
    repr of a large container in full, that never raises."""
    try:
        text = _repr.repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 3] + "..."


def duration(seconds: float) -> str:
    """``0.008 ms``, ``0.812 ms``, ``12.3 ms``, ``1.25 s``, ``312 s``."""
    if seconds < 0.001:
        return f"{seconds * 1000:.3f} ms"
    if seconds < 1.0:
        return f"{seconds * 1000:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


class CallLog:
    """A worker's call lines and summaries (see the module's docstring for the rule)."""

    def __init__(
        self,
        tally: Tally,
        *,
        every_call: bool = False,
        interval: float = SUMMARY_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tally = tally
        self.every_call = every_call
        self.interval = interval
        self._clock = clock
        self._tokens = float(BURST)
        self._refilled = clock()
        #: True while the worker logs summaries instead of a line per call.
        self.summarizing = False
        self._base: dict[tuple[str, str], tuple[int, int, int, int]] = {}
        self._since = 0.0
        self._next = 0.0

    # -- deciding, per batch ---------------------------------------------------------------

    def admit(self, calls: int) -> bool:
        """Whether the ``calls`` of a batch just fetched are logged one by one (called once per
        batch, by the fetch loop); False switches to summaries when the batch does not fit."""
        if not log.isEnabledFor(logging.INFO):
            return False
        if self.every_call:
            return True
        if self.summarizing:
            return False
        now = self._clock()
        self._tokens = min(float(BURST), self._tokens + (now - self._refilled) * LINES_PER_SECOND)
        self._refilled = now
        if calls <= self._tokens:
            self._tokens -= calls
            return True
        self.summarizing = True
        self._base = self.tally.snapshot()
        self._since = now
        self._next = now + self.interval
        log.info(
            "more than %g calls a second: logging a summary every %g s instead of a line per "
            "call (--log-tasks logs every call)",
            LINES_PER_SECOND,
            self.interval,
        )
        return False

    def tick(self) -> None:
        """Log the summary when its interval is over (called between fetches)."""
        if self.summarizing and self._clock() >= self._next:
            self.summarize()

    def close(self) -> None:
        """At the worker's stop: the summary of the last interval, if summarizing."""
        if self.summarizing:
            self.summarize()

    # -- summaries -------------------------------------------------------------------------

    def summarize(self) -> None:
        """Log the calls since the last summary, per task; go back to a line per call if they
        averaged ``LINES_PER_SECOND`` a second or fewer."""
        now = self._clock()
        snapshot = self.tally.snapshot()
        base = self._base
        rows: list[dict[str, Any]] = []
        for (queue, task), (processed, _failed, retried, dead) in sorted(snapshot.items()):
            before = base.get((queue, task), (0, 0, 0, 0))
            calls = processed - before[0]
            retried -= before[2]
            dead -= before[3]
            if calls or retried or dead:
                ok = max(calls - retried - dead, 0)
                rows.append(
                    {
                        "task": task,
                        "queue": queue,
                        "calls": calls,
                        "ok": ok,
                        "retried": retried,
                        "dead": dead,
                    }
                )
        elapsed = max(now - self._since, 1e-9)
        total = sum(r["calls"] for r in rows)
        rows.sort(key=lambda r: -r["calls"])
        if rows:  # an idle interval says nothing
            log.info(
                "last %.1f s: %s calls (%s/s): %s",
                elapsed,
                f"{total:,}",
                f"{total / elapsed:,.0f}",
                _tasks_text(rows),
                extra={"fields": {"interval": round(elapsed, 3), "calls": total, "tasks": rows}},
            )
        self._base = snapshot
        self._since = now
        if total <= LINES_PER_SECOND * elapsed:
            self.summarizing = False
            self._tokens = float(BURST)
            self._refilled = now
        else:
            self._next = now + self.interval

    # -- lines -----------------------------------------------------------------------------

    def calls(self, calls: Calls) -> None:
        """The lines of a logged batch's calls of one task that returned and were settled
        (``calls.failures``, failed all the same, have their failure lines)."""
        name = calls.task.name
        failures = calls.failures
        rows = zip(calls.deliveries, calls.messages, calls.results, calls.runtimes, strict=True)
        for i, (delivery, message, result, ran) in enumerate(rows):
            if i not in failures:
                self.ok(name, delivery.queue, message, result, ran)

    def job(self, job: Job, result: Any) -> None:
        """The line of a call that returned outside a batch's columns (a ``Job``)."""
        ran = job.finished - job.started if job.started and job.finished else 0.0
        self.ok(job.task.name, job.delivery.queue, job.message, result, ran)

    def ok(self, task: str, queue: str, message: Message, result: Any, ran: float) -> None:
        fields: dict[str, Any] = {
            "task": task,
            "id": message.id,
            "queue": queue,
            "outcome": "ok",
            "runtime": round(ran, 6),
            "attempt": message.attempt + 1,
        }
        tail = ""
        if result is not None:
            fields["result"] = shown = short_repr(result)
            tail = ": " + shown
        if message.attempt:
            tail = f" (attempt {message.attempt + 1}){tail}"
        log.info(
            "%s[%s] ok in %s%s", task, message.id, duration(ran), tail, extra={"fields": fields}
        )

    def failed(self, job: Job, outcome: Outcome, ran: float | None = None) -> None:
        """The line of a failed call: retried (WARNING), or dead-lettered (ERROR; WARNING when
        the task rejected it)."""
        message, task, error = job.message, job.task, outcome.error
        if ran is None and job.started and job.finished:
            ran = job.finished - job.started
        what = describe(error) if error is not None else "failed"
        fields: dict[str, Any] = {
            "task": task.name,
            "id": message.id,
            "queue": job.delivery.queue,
            "outcome": outcome.kind,
            "attempt": message.attempt + 1,
            "error": what,
        }
        took = ""
        if ran is not None:
            fields["runtime"] = round(ran, 6)
            took = f" in {duration(ran)}"
        head = f"{task.name}[{message.id}]"
        if outcome.kind == "retry":
            eta = outcome.message.eta if outcome.message is not None else None
            delay = max(eta - time.time(), 0.0) if eta else 0.0
            fields["retry_in"] = round(delay, 3)
            log.warning(
                "%s failed%s: %s (retry %d of %d in %s)",
                head,
                took,
                what,
                message.attempt + 1,
                task.retries,
                duration(delay),
                extra={"fields": fields},
            )
            return
        fields["reason"] = why = _first_line(outcome.reason)
        if isinstance(error, Reject):
            log.warning(
                "%s rejected%s: %s; dead-lettered",
                head,
                took,
                safe_str(error.reason),
                extra={"fields": fields},
            )
            return
        if "\n" in outcome.reason and message.attempt >= task.retries:  # the usual reason
            why = f"attempt {message.attempt + 1} of {task.retries + 1}, no retries left"
        log.error(
            "%s failed%s: %s; dead-lettered (%s)", head, took, what, why, extra={"fields": fields}
        )


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0].rstrip(":")


def _tasks_text(rows: list[dict[str, Any]], most: int = 8) -> str:
    """``tasks.add 48,000 ok, tasks.fail 213 (13 ok, 150 retried, 50 dead)``: the busiest
    ``most`` tasks, then how many more."""
    parts = []
    for r in rows[:most]:
        name = r["task"] if r["queue"] == "default" else f"{r['task']} on {r['queue']}"
        if not (r["retried"] or r["dead"]):
            parts.append(f"{name} {r['ok']:,} ok")
            continue
        ends = [f"{r[k]:,} {k}" for k in ("ok", "retried", "dead") if r[k]]
        parts.append(f"{name} {r['calls']:,} ({', '.join(ends)})")
    if len(rows) > most:
        parts.append(f"and {len(rows) - most} more tasks")
    return ", ".join(parts)
