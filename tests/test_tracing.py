"""OpenTelemetry tracing middleware: trace context in message headers, process spans linked to
send spans, on a real worker (memory broker), spans read from the SDK's in-memory exporter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import (
    TraceContextTextMapPropagator,
)

from hurtle import Hurtle
from hurtle.middleware.tracing import Tracing


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def app(exporter: InMemorySpanExporter) -> Iterator[Hurtle]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider, propagator=TraceContextTextMapPropagator())
    app = Hurtle("memory://", middleware=[tracing])
    yield app
    app.broker.close()


def spans_when(exporter: InMemorySpanExporter, n: int) -> list[ReadableSpan]:
    deadline = time.monotonic() + 30
    while len(spans := list(exporter.get_finished_spans())) < n:
        assert time.monotonic() < deadline, f"only {len(spans)} spans of {n}"
        time.sleep(0.02)
    return spans


def run_until(app: Hurtle, exporter: InMemorySpanExporter, n: int) -> list[ReadableSpan]:
    worker = app.worker(queues=["default"])
    thread = worker.run_in_thread()
    try:
        return spans_when(exporter, n)
    finally:
        worker.stop()
        thread.join(30)


def test_a_published_batch_makes_one_send_span_whose_context_every_message_carries(
    app: Hurtle, exporter: InMemorySpanExporter
) -> None:
    add = app.task(name="add")(lambda a, b: a + b)
    messages = [add.message((i, i), {}) for i in range(3)]
    (tracing,) = [m for m in app.middleware if isinstance(m, Tracing)]
    sent = tracing.before_publish(messages)

    (span,) = exporter.get_finished_spans()
    assert (span.name, span.kind) == ("add send", SpanKind.PRODUCER)
    assert span.attributes is not None and span.attributes["messaging.batch.message_count"] == 3
    context = span.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert [m.headers["traceparent"] for m in sent] == [expected] * 3
    assert [m.id for m in sent] == [m.id for m in messages]


def test_the_process_span_is_linked_to_the_send_span_and_current_during_the_call(
    app: Hurtle, exporter: InMemorySpanExporter
) -> None:
    inside: list[int] = []

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        from opentelemetry import trace

        inside.append(trace.get_current_span().get_span_context().span_id)
        return a + b

    add.send(1, 2)
    spans = run_until(app, exporter, 2)
    send = next(s for s in spans if s.kind == SpanKind.PRODUCER)
    process = next(s for s in spans if s.kind == SpanKind.CONSUMER)
    assert process.name == "add process"
    (link,) = process.links
    assert link.context.trace_id == send.context.trace_id
    assert link.context.span_id == send.context.span_id
    assert inside == [process.context.span_id]  # the task ran inside its process span
    assert process.status.status_code == StatusCode.UNSET


def test_a_call_that_raises_marks_its_span_as_an_error(
    app: Hurtle, exporter: InMemorySpanExporter
) -> None:
    @app.task(name="boom", retries=0)
    def boom() -> None:
        raise ValueError("it broke")

    boom.send()
    spans = run_until(app, exporter, 2)
    process = next(s for s in spans if s.kind == SpanKind.CONSUMER)
    assert process.status.status_code == StatusCode.ERROR
    assert process.status.description == "ValueError: it broke"
    assert [e.name for e in process.events] == ["exception"]


def test_a_message_without_trace_context_gets_a_process_span_without_links(
    app: Hurtle, exporter: InMemorySpanExporter
) -> None:
    add = app.task(name="add")(lambda a, b: a + b)
    app.broker.publish([add.message((1, 2), {})])  # straight to the broker: no send span
    (process,) = run_until(app, exporter, 1)
    assert (process.kind, list(process.links)) == (SpanKind.CONSUMER, [])
