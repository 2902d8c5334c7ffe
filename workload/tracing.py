"""Request traces over OTLP/HTTP: the load generator starts a trace per request and sends its W3C `traceparent`;
the server continues it with a span per completion and child spans for queue wait, prefill and decode.

Span and attribute names are vLLM's (`--otlp-traces-endpoint`: span `llm_request`, `gen_ai.latency.*`,
`gen_ai.usage.*`, `gen_ai.request.*`), so a trace looks the same from either server; the children and the batch
sizes are ours (`workload.*`). Off unless an endpoint is given (`--otlp-endpoint`). A `traceparent` that is
malformed is ignored and a new trace is started (the W3C propagator's rule)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SPAN_NAME = "llm_request"  # vLLM's
# The export queue's bound: a Collector that is down costs at most this many spans of memory, then drops.
MAX_QUEUED_SPANS = 2048
_PROPAGATOR = TraceContextTextMapPropagator()


def provider(endpoint: str, service_name: str, timeout_s: float = 5.0) -> TracerProvider:
    """A TracerProvider exporting in batches from a thread of its own, so a slow Collector never holds a request."""
    p = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces", timeout=timeout_s)
    p.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=MAX_QUEUED_SPANS, schedule_delay_millis=1000))
    return p


def check_endpoint(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--otlp-endpoint must be an http:// or https:// URL, got {url!r}")
    return url


def trace_id_hex(span: Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


@dataclass(frozen=True)
class Timings:
    """A finished request's moments on the scheduler's monotonic clock, and its batch size at each step."""

    arrival: float
    admitted_at: float | None
    first_token_at: float | None
    finished_at: float | None
    batch_sizes: Sequence[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class ServerTracing:
    """The server's side: one `llm_request` span per completion, its three children made when it ends."""

    def __init__(self, tracer_provider: TracerProvider, model_name: str,
                 mono_to_wall: float | None = None) -> None:
        self._provider = tracer_provider
        self._tracer = tracer_provider.get_tracer("workload")
        self.model_name = model_name
        # The scheduler's clock is monotonic; spans need wall time. One offset, read at start.
        self._offset = time.time() - time.monotonic() if mono_to_wall is None else mono_to_wall

    def _ns(self, mono: float) -> int:
        return int((mono + self._offset) * 1e9)

    def start(self, headers: Mapping[str, str], arrival: float, request_id: str, max_tokens: int,
              temperature: float) -> Span:
        context = _PROPAGATOR.extract({k.lower(): v for k, v in headers.items()})
        return self._tracer.start_span(SPAN_NAME, context=context, kind=SpanKind.SERVER,
                                       start_time=self._ns(arrival), attributes={
                                           "gen_ai.operation.name": "text_completion",
                                           "gen_ai.request.model": self.model_name,
                                           "gen_ai.request.id": request_id,
                                           "gen_ai.request.max_tokens": max_tokens,
                                           "gen_ai.request.temperature": temperature,
                                       })

    def finish(self, span: Span, t: Timings) -> None:
        """End the span at the request's last token (or now, if it never finished) with vLLM's latency attributes
        and the queue / prefill / decode children."""
        end = t.finished_at if t.finished_at is not None else time.monotonic()
        span.set_attributes({
            "gen_ai.response.model": self.model_name,
            "gen_ai.response.finish_reasons": [t.finish_reason],
            "gen_ai.usage.prompt_tokens": t.prompt_tokens,
            "gen_ai.usage.completion_tokens": t.completion_tokens,
            "gen_ai.usage.input_tokens": t.prompt_tokens,
            "gen_ai.usage.output_tokens": t.completion_tokens,
            "gen_ai.latency.e2e": end - t.arrival,
        })
        parent = trace.set_span_in_context(span)
        if t.admitted_at is not None:
            span.set_attribute("gen_ai.latency.time_in_queue", t.admitted_at - t.arrival)
            self._child("queue", parent, t.arrival, t.admitted_at, {"gen_ai.latency.time_in_queue":
                                                                    t.admitted_at - t.arrival})
        if t.admitted_at is not None and t.first_token_at is not None:
            span.set_attributes({"gen_ai.latency.time_to_first_token": t.first_token_at - t.arrival,
                                 "gen_ai.latency.time_in_model_prefill": t.first_token_at - t.admitted_at})
            self._child("prefill", parent, t.admitted_at, t.first_token_at, {
                "gen_ai.usage.prompt_tokens": t.prompt_tokens,
                "gen_ai.latency.time_in_model_prefill": t.first_token_at - t.admitted_at,
                "workload.batch_size": t.batch_sizes[0] if t.batch_sizes else 0})
        if t.first_token_at is not None:
            decode = list(t.batch_sizes[1:])
            span.set_attribute("gen_ai.latency.time_in_model_decode", end - t.first_token_at)
            self._child("decode", parent, t.first_token_at, end, {
                "gen_ai.usage.completion_tokens": t.completion_tokens,
                "gen_ai.latency.time_in_model_decode": end - t.first_token_at,
                "workload.batch_sizes": decode,
                "workload.batch_size.max": max(decode, default=0)})
        span.end(end_time=self._ns(end))

    def _child(self, name: str, parent, start: float, end: float, attributes: dict) -> None:
        child = self._tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL, start_time=self._ns(start),
                                        attributes=attributes)
        child.end(end_time=self._ns(end))

    def shutdown(self) -> None:
        self._provider.shutdown()


class LoadTracing:
    """The load generator's side: a CLIENT span per request, whose context goes out as `traceparent`."""

    def __init__(self, tracer_provider: TracerProvider) -> None:
        self._provider = tracer_provider
        self._tracer = tracer_provider.get_tracer("workload.loadgen")

    def start(self, max_tokens: int) -> tuple[Span, dict[str, str]]:
        span = self._tracer.start_span("completion", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "text_completion", "gen_ai.request.max_tokens": max_tokens})
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return span, carrier

    def shutdown(self) -> None:
        self._provider.shutdown()
