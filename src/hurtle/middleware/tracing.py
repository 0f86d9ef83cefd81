"""OpenTelemetry tracing as middleware (``pip install "hurtle[otel]"``).

``Hurtle(middleware=[Tracing()])`` (or ``app.add_middleware(Tracing())``), on the producers and
the workers:

* each published batch gets one ``send`` span (kind PRODUCER), a child of whatever span is
  current; its context goes into every message's headers (``traceparent``, and ``tracestate``
  when there is one: the W3C trace context, through the global propagator unless one is given).
  One span per batch, not per message: ``send_many`` of ten thousand messages makes one span;
* each call gets a ``process`` span (kind CONSUMER) around it, *linked* to the send span whose
  context its message carries (OpenTelemetry's messaging conventions: a message may be run long
  after it was sent, and a batch's messages come from many sends), current while the task runs
  (spans the task makes are its children). A call that raises marks the span as an error and
  records the exception.

What it costs: tracing takes every task off the worker's inline path (a span per call is a
per-call hook). Spans go where the tracer provider sends them (the global one unless given).
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'hurtle.middleware.tracing needs OpenTelemetry: pip install "hurtle[otel]"'
    ) from err

from .._text import safe_str
from ..message import Message
from . import Job, Middleware

__all__ = ["Tracing"]

#: The instrumentation scope of hurtle's spans.
SCOPE = "hurtle"
#: The headers that carry the trace context (W3C trace context).
CONTEXT_HEADERS = ("traceparent", "tracestate")


class Tracing(Middleware):
    """Send and process spans, the trace context in message headers (module docstring)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        self.propagator = propagator
        # the process span of each running job, with the token that made it current
        self._open: dict[int, tuple[trace.Span, object]] = {}
        self._lock = threading.Lock()

    def _inject(self, carrier: dict[str, str]) -> None:
        if self.propagator is not None:
            self.propagator.inject(carrier)
        else:
            propagate.inject(carrier)

    def _extract(self, headers: dict[str, Any]) -> Any:
        carrier = {k: v for k in CONTEXT_HEADERS if isinstance(v := headers.get(k), str)}
        if self.propagator is not None:
            return self.propagator.extract(carrier)
        return propagate.extract(carrier)

    # -- producer side ------------------------------------------------------------------------

    def before_publish(self, messages: list[Message]) -> list[Message]:
        if not messages:
            return messages
        queues = sorted({m.queue for m in messages})
        tasks = sorted({m.task for m in messages})
        name = f"{tasks[0]} send" if len(tasks) == 1 else "hurtle send"
        attributes: dict[str, Any] = {
            "messaging.system": "hurtle",
            "messaging.operation.type": "send",
            "messaging.batch.message_count": len(messages),
            "messaging.destination.name": ",".join(queues),
        }
        if len(messages) == 1:
            attributes["messaging.message.id"] = messages[0].id
        with self.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes):
            carrier: dict[str, str] = {}
            self._inject(carrier)
        if not carrier:  # tracing is off (no SDK, or a non-recording span): nothing to carry
            return messages
        replace = msgspec.structs.replace
        return [replace(m, headers={**m.headers, **carrier}) for m in messages]

    # -- worker side ---------------------------------------------------------------------------

    def before_process(self, job: Job) -> None:
        message = job.message
        sent = trace.get_current_span(self._extract(message.headers)).get_span_context()
        links = [Link(sent)] if sent.is_valid else []
        span = self.tracer.start_span(
            f"{message.task} process",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "hurtle",
                "messaging.operation.type": "process",
                "messaging.destination.name": message.queue,
                "messaging.message.id": message.id,
                "hurtle.task": message.task,
                "hurtle.attempt": message.attempt,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        with self._lock:
            self._open[id(job)] = (span, token)

    def after_process(self, job: Job, result: Any, error: BaseException | None) -> None:
        with self._lock:
            opened = self._open.pop(id(job), None)
        if opened is None:
            return
        span, token = opened
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {safe_str(error)}"))
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        finally:
            span.end()
