"""``Worker``: starts and stops one worker process's parts, and runs its fetch loop.

Parts (DESIGN.md, "Layers"): the fetch loop here pulls batches from the broker as fast as the
executor has room; the executor runs them through the processor; the acker settles outcomes in
batches; the heartbeat keeps this worker's deliveries its own. This module owns the order in which
they start and stop, signals, and ``burst`` mode; it knows nothing of how tasks run.

Stopping. The first SIGTERM/SIGINT (or ``stop()``) ends fetching; running tasks get up to
``shutdown_timeout`` seconds, counted from that moment, to finish; what was fetched but not
started, and what still runs after the deadline, goes back to the broker; outcomes are flushed. A
second signal skips the wait: running tasks are handed back at once (in the solo pool, where the
task runs on this very thread, by raising in it).

In the solo pool, when the worker handles signals on the main thread, a small thread waits for
the deadline and, if a task still runs then, signals the main thread, whose handler raises in
the task as a second signal would (off the main thread the stop waits for it). A hard stop never
lands between tasks: it raises only while a task's own code runs (``interrupts_caller``). The
last prefetch is read before the acker's last flush: what rode it unrecorded is flushed again.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from secrets import token_hex
from types import FrameType
from typing import TYPE_CHECKING

from ..brokers import Consumer, Delivery
from ..brokers.fair_consumer import consumer_of
from ..brokers.reports import Reporter
from ..errors import BrokerError, ConfigurationError, DecodeError
from ..message import Message, message_id
from ..middleware import Middleware, WorkerParts, overrides
from ..names import check_queue_name
from ..progress import INTERVAL
from ..scheduler import Scheduler
from .acker import Acker
from .executors import Executor, make_executor
from .fetcher import Fetcher
from .heartbeat import Heartbeat
from .log import SUMMARY_EVERY, CallLog
from .processor import Processor
from .screen import Screen
from .tracker import Tracker

if TYPE_CHECKING:
    from ..app import Hurtle

log = logging.getLogger(__name__)


class _HardStop(BaseException):
    """Raised in the worker's thread by a second signal: hand everything back and exit now."""


class Worker:
    """Consumes ``queues`` (default: every queue the app's tasks name) until stopped.

    ``burst=True`` returns once the queues have nothing ready, delayed or in flight.
    ``min_concurrency`` (below ``concurrency``) lets a pool scale itself with the backlog.
    ``recycle_abandoned=True`` (set under a supervisor) stops the worker gracefully once a task
    overran its time limit in a thread that cannot be interrupted, so that a fresh process takes
    its place (``recycle`` is then True). ``parent_pid`` stops the worker if that process dies.
    ``scheduler=False`` leaves the app's periodic tasks to other workers.
    At INFO, the worker logs a line per call while calls are few, else a summary every
    ``log_interval`` seconds (``log.CallLog``); ``log_tasks=True`` logs every call.
    The worker runs the app's middleware (``app.middleware``), then ``middleware``, if given.
    """

    #: Seconds between two writes of the running tasks' progress reports (``tracker``).
    progress_interval = INTERVAL

    def __init__(
        self,
        app: Hurtle,
        *,
        queues: Sequence[str] | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        min_concurrency: int | None = None,
        burst: bool = False,
        shutdown_timeout: float | None = None,
        middleware: Sequence[Middleware] = (),
        worker_id: str | None = None,
        recycle_abandoned: bool = False,
        parent_pid: int | None = None,
        scheduler: bool = True,
        log_tasks: bool = False,
        log_interval: float = SUMMARY_EVERY,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        self.app = app
        self.settings = app.settings
        if isinstance(queues, str):
            raise ConfigurationError(
                f"queues must be a list of queue names, got the str {queues!r}: "
                f"write queues=[{queues!r}]"
            )
        self.queues = tuple(map(check_queue_name, queues)) if queues else tuple(app.queues())
        self.pool = pool
        self.burst = burst
        self.shutdown_timeout = (
            self.settings.shutdown_timeout if shutdown_timeout is None else shutdown_timeout
        )
        # random, not a counter: a process restarted in place (same host, same pid) must not
        # take its dead predecessor's id and keep that one's deliveries alive with its beats
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{token_hex(4)}"
        self.executor: Executor = make_executor(
            pool,
            concurrency,
            min_concurrency=min_concurrency,
            max_batch=self.settings.fetch_batch_size,
        )
        self._extra_middleware = list(middleware)
        #: What this worker runs: the app's middleware as of ``run``, then ``middleware``.
        self.middleware = app.middleware + self._extra_middleware
        self.recycle_abandoned = recycle_abandoned
        self.parent_pid = parent_pid
        if not log_interval > 0:
            raise ConfigurationError(
                f"log_interval must be a number of seconds > 0, got {log_interval!r}"
            )
        self.log_tasks = log_tasks
        self.log_interval = log_interval
        #: Enqueue the app's periodic tasks (``hurtle.scheduler``) while this worker runs.
        self.scheduler: Scheduler | None = Scheduler(app) if scheduler and app.schedules else None
        self._stop = threading.Event()
        self._hard = threading.Event()
        self._signals = 0
        self._handling_signals = False
        self._overdue = False  # set by the deadline thread just before it signals the main thread
        self._stop_deadline: float | None = None
        self._finished = threading.Event()
        self.consumer: Consumer | None = None
        self.acker: Acker | None = None
        self.processor: Processor | None = None
        self.screen: Screen | None = None
        self.heartbeat: Heartbeat | None = None
        self.call_log: CallLog | None = None
        self.tracker: Tracker | None = None
        #: Set once the worker has started its parts (tests and the demo wait on it).
        self.started = threading.Event()
        #: True when the worker stopped to be replaced by a fresh process (``recycle_abandoned``).
        self.recycle = False

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop: no new fetches, running tasks finish, the rest goes back."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.shutdown_timeout
        self._stop.set()
        self.executor.request_stop()

    def stop_now(self) -> None:
        """Ask for a hard stop: running tasks are handed back without waiting for them."""
        self._hard.set()
        self.stop()

    @property
    def processed(self) -> int:
        return self.processor.processed if self.processor else 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._overdue:  # sent by the deadline thread, not by a user
            self._overdue = False
            if not self._hard.is_set():
                log.warning(
                    "tasks still running after the shutdown timeout of %gs: handing them back",
                    self.shutdown_timeout,
                )
                self.stop_now()
                if self.executor.interrupts_caller():
                    raise _HardStop()
            return
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.info("%s received: stopping gracefully (send it again to stop now)", name)
            self.stop()
        elif self._signals == 2:
            log.warning("%s received again: handing back running tasks and stopping now", name)
            self.stop_now()
            if self.executor.interrupts_caller():
                raise _HardStop()

    def install_signal_handlers(self) -> None:
        """Handle SIGTERM/SIGINT, when called on the main thread (else signals stay as they are).

        Asking Python rather than ``threading``: greenlet libraries patch ``threading``.
        """
        try:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        except ValueError:
            log.debug("not on the main thread: signals are left to the program")
        else:
            self._handling_signals = True

    # -- running ---------------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped (or drained, with ``burst``)."""
        s = self.settings
        broker = self.app.broker
        weights = self.app.fair_weights(self.queues)  # fair tasks' keys: read by turns
        consumer = self.consumer = consumer_of(broker, self.queues, self.worker_id, weights)
        acker = self.acker = Acker(
            consumer, batch_size=s.ack_batch_size, interval=s.ack_interval_ms / 1000.0
        )
        executor = self.executor
        self.middleware = self.app.middleware + self._extra_middleware
        processor = self.processor = Processor(
            self.app,
            acker,
            self.middleware,
            limit=executor.limit,
            shared_loop=executor.greenlets,
            inline_limits=executor.watches_time_limits(),
        )
        self.call_log = processor.call_log = CallLog(
            processor.tally, every_call=self.log_tasks, interval=self.log_interval
        )
        acker.ends = processor.ends_of
        consumer.reporter = Reporter(
            processor.tally,
            worker_id=self.worker_id,
            pool=self.pool,
            concurrency=executor.concurrency,
            queues=self.queues,
            timings=processor.timings,
            running=executor.running,
        )
        heartbeat = self.heartbeat = Heartbeat(consumer, s.effective_heartbeat_interval)
        heartbeat.beat()
        acker.start()
        heartbeat.start()
        self.screen = processor.screen = Screen(broker, executor.waiting, processor.cancelled)
        tracker = self.tracker = processor.tracker = Tracker(
            broker,
            self.progress_interval,
            running=executor.running_items,
            on_cancel=executor.cancel_running,
        )
        processor.cancels = tracker.cancelled
        executor.start(processor)
        tracker.start()
        self._hook("worker_start")
        if (
            self._handling_signals
            and executor.runs_in_submit
            and threading.current_thread() is threading.main_thread()
        ):
            threading.Thread(
                target=self._keep_deadline,
                args=(threading.get_ident(),),
                name="hurtle-shutdown-deadline",
                daemon=True,
            ).start()
        if self.scheduler is not None:
            self.scheduler.start()
        log.info(
            "worker %s consuming %s with the %s pool (concurrency %d) on %s",
            self.worker_id,
            ", ".join(self.queues),
            self.pool,
            executor.concurrency,
            broker.url,
        )
        self.started.set()
        try:
            try:
                self._fetch_loop(consumer, executor)
                unfinished = self._drain(executor)
            except _HardStop:
                unfinished = executor.stop() + executor.abort()
            except BaseException:
                self._shutdown(executor.stop() + executor.abort())
                raise
            self._shutdown(unfinished)
        finally:
            self._finished.set()
            self._stop.set()  # lets the deadline thread end

    def _keep_deadline(self, main_thread: int) -> None:
        """Interrupt a task still running on the main thread at the graceful stop's deadline."""
        self._stop.wait()
        deadline = self._stop_deadline
        if deadline is None or self._finished.wait(max(deadline - time.monotonic(), 0.0)):
            return
        if not self._hard.is_set() and self.executor.interrupts_caller():
            self._overdue = True
            signal.pthread_kill(main_thread, signal.SIGTERM)

    def _fetch_loop(self, consumer: Consumer, executor: Executor) -> None:
        s = self.settings
        # a burst worker looks at the queue counts as soon as a short wait finds nothing
        wait = min(s.fetch_timeout, 0.05) if self.burst else s.fetch_timeout
        assert self.acker is not None
        fetcher = Fetcher(consumer, executor, self.acker, wait, self._stop, self.processor)
        call_log = self.call_log
        assert call_log is not None
        while not self._stop.is_set():
            if self._must_leave(executor):
                return
            batch = fetcher.fetch()
            self._note(fetcher, batch)
            call_log.tick()
            if batch and fetcher.cancellations:
                batch = self._screen(batch)
            if batch:
                if self._must_leave(executor):  # it may have come true during the fetch
                    self.acker.release(batch)
                    return
                self._submit(executor, batch, fetcher.sent_at)
            elif batch is not None and self.burst and self._drained():
                log.info("burst: queues %s are empty, stopping", ", ".join(self.queues))
                return

    def _submit(self, executor: Executor, batch: list[Delivery], sent_at: float) -> None:
        """Hand a batch to the executor, telling the ``Screen`` when the broker state it was
        checked against was read (solo runs it inside ``submit``: told first)."""
        screen, processor, call_log = self.screen, self.processor, self.call_log
        assert screen is not None and processor is not None and call_log is not None
        processor.log_calls = call_log.admit(len(batch))  # once per batch: see log.py
        if executor.runs_in_submit:
            screen.fetched(sent_at, alone=True)
            executor.submit(batch)
            return
        alone = not executor.waiting()
        executor.submit(batch)
        screen.fetched(sent_at, alone)

    def _screen(self, batch: list[Delivery]) -> list[Delivery]:
        """The deliveries of ``batch`` not cancelled: one broker call, made only when the fetch
        said that cancellations are live. The cancelled ones are recorded as such (a dead letter
        ``cancelled``, and a ``cancelled`` record for tasks that keep results), not run."""
        assert self.processor is not None and self.acker is not None
        ids = [message_id(d.raw) for d in batch]
        try:
            gone = self.app.broker.cancelled([i for i in ids if i])
        except BrokerError as err:
            log.warning(
                "cannot read which messages are cancelled (%s): handing back a batch of %d",
                err,
                len(batch),
            )
            self.acker.release(batch)
            self._stop.wait(1.0)
            return []
        if not gone:
            return batch
        kept: list[Delivery] = []
        skipped: list[Delivery] = []
        for delivery, id_ in zip(batch, ids, strict=True):
            (skipped if id_ in gone else kept).append(delivery)
        self.processor.cancelled(skipped)
        return kept

    def _must_leave(self, executor: Executor) -> bool:
        if self.recycle_abandoned and executor.abandoned():
            log.warning(
                "a task overran its time limit in a thread that cannot be interrupted: "
                "stopping this worker so that a fresh process replaces it"
            )
            self.recycle = True
            return True
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            log.warning("the supervisor (pid %d) is gone: stopping", self.parent_pid)
            return True
        return False

    def _drained(self) -> bool:
        assert self.acker is not None
        if not self.executor.idle():
            return False
        self.acker.flush()
        if self.acker.pending:
            return False
        try:
            stats = self.app.broker.stats(self.queues)
        except BrokerError as err:  # unreachable for now: not drained as far as we know
            log.warning("cannot read the queue counts: %s", err)
            return False
        # a paused queue's waiting messages are not for now: only what is in flight counts
        return all(
            (q.paused or (q.ready == 0 and q.delayed == 0)) and q.in_flight == 0
            for q in stats.values()
        )

    def _drain(self, executor: Executor) -> list[Delivery]:
        """Graceful stop: hand back the unstarted, wait for the running (up to the deadline)."""
        unstarted = executor.stop()
        deadline = self._stop_deadline
        if deadline is None:  # the fetch loop ended by itself (burst, recycle)
            deadline = time.monotonic() + self.shutdown_timeout
        while not executor.join(max(min(0.1, deadline - time.monotonic()), 0.0)):
            if self._hard.is_set():
                break
            if time.monotonic() >= deadline:
                log.warning(
                    "tasks still running after the shutdown timeout of %gs: handing them back",
                    self.shutdown_timeout,
                )
                break
        return unstarted + executor.abort()

    def _shutdown(self, unfinished: list[Delivery]) -> None:
        assert self.consumer and self.acker and self.heartbeat and self.processor
        if self.scheduler is not None:
            self.scheduler.stop()
        try:  # the last prefetch read now: what rode it unrecorded goes back to the acker
            unfinished = unfinished + self.consumer.take_prefetched()
        except Exception as err:
            log.debug("could not read the last prefetch: %s", err)
        if unfinished:
            log.info("handing back %d fetched but unfinished tasks", len(unfinished))
        self.acker.release(unfinished)
        self._hook("worker_stop")
        self.acker.stop()
        self.heartbeat.stop()
        try:
            self.consumer.close()
        except Exception as err:
            log.warning("could not close the broker session cleanly: %s", err)
        self.executor.close()
        self.processor.close()
        if self.tracker is not None:
            self.tracker.close()
        if self.call_log is not None:
            self.call_log.close()
        log.info("worker %s stopped after %d tasks", self.worker_id, self.processor.processed)

    def _hook(self, name: str) -> None:
        """Call ``worker_start`` or ``worker_stop`` on the middleware that define it."""
        parts: WorkerParts = self  # what the hooks may use of this worker, checked by mypy
        for m in self.middleware:
            if overrides(m, name):
                try:
                    getattr(m, name)(parts)
                except Exception as err:
                    log.error("middleware %r failed in %s: %s", m, name, err)

    def run_in_thread(self) -> threading.Thread:
        """Start ``run`` on a daemon thread (tests, the demo); returns once the worker started."""
        t = threading.Thread(target=self.run, name="hurtle-worker", daemon=True)
        t.start()
        while not self.started.wait(0.05):
            if not t.is_alive():
                break
        return t

    #: When the fetches began to fail in a row (monotonic time), or None while they succeed.
    _unreachable_since: float | None = None

    def _note(self, fetcher: Fetcher, batch: list[Delivery] | None) -> None:
        """After each fetch: a burst worker gives up on a broker that stays unreachable for
        ``unreachable_timeout`` (BrokerError: exit 2); at DEBUG, one line per batch."""
        if not fetcher.failures:
            self._unreachable_since = None
            if batch and log.isEnabledFor(logging.DEBUG):
                queues = ", ".join(sorted({d.queue for d in batch}))
                log.debug("fetched %d deliveries from %s: %s", len(batch), queues, _summary(batch))
            return
        if not self.burst:
            return  # a long-running worker rides out the outage
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        elif now - self._unreachable_since > self.settings.unreachable_timeout:
            raise BrokerError(
                f"burst: the broker {self.app.broker.url} has been unreachable for "
                f"{now - self._unreachable_since:.1f}s (longer than HURTLE_UNREACHABLE_TIMEOUT, "
                f"{self.settings.unreachable_timeout:g}s): giving up with the queues unfinished"
            )


def _summary(batch: list[Delivery]) -> str:
    """Tasks by name with their counts, and the first and last message id (DEBUG only)."""
    counts: dict[str, int] = {}
    ids: list[str] = []
    for d in batch:
        try:
            m: Message | None = Message.decode(d.raw)
        except DecodeError:
            m = None
        name = m.task if m is not None else "(undecodable)"
        counts[name] = counts.get(name, 0) + 1
        if m is not None:
            ids.append(m.id)
    tasks = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))
    return f"{tasks}; ids {ids[0]} .. {ids[-1]}" if ids else tasks
