"""The spans, with OpenTelemetry (the ``agent-cache[otel]`` extra); imported only when tracing is on.

A call's span follows the GenAI semantic conventions for an inference client span (name
``{gen_ai.operation.name} {gen_ai.request.model}``, kind CLIENT, covering every retry) with
agent-cache's own attributes under ``agent_cache.*``; each attempt is a child span whose
context travels to the worker as ``traceparent``.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any, Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from agent_cache.telemetry import trace_context
from agent_cache.values import Placement, RouteRequest, Usage

PROVIDER = "sglang"
_SCOPE = "agent_cache"


def _provider() -> trace.TracerProvider:
    """The application's tracer provider if it set one up; else one built from the OTEL_* environment
    (OTLP over HTTP/protobuf, or the console with ``OTEL_TRACES_EXPORTER=console``), installed globally."""
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {SERVICE_NAME: "agent-cache"}))
    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:  # the exporter reads OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout, compression) itself
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* tune it; flushed at exit
    trace.set_tracer_provider(provider)
    return provider


def _error_type(error: BaseException) -> str:
    code = getattr(error, "code", None)
    return code if isinstance(code, str) and code else type(error).__name__


def _usage_attributes(usage: Usage | None) -> dict[str, Any]:
    if usage is None:
        return {}
    out: dict[str, Any] = {"gen_ai.usage.input_tokens": usage.prompt_tokens,
                           "gen_ai.usage.output_tokens": usage.completion_tokens}
    if usage.cached_tokens is not None:
        out["gen_ai.usage.cache_read_input_tokens"] = usage.cached_tokens
        out["agent_cache.cached_tokens"] = usage.cached_tokens
    return out


def _placement_attributes(placement: Placement) -> dict[str, Any]:
    return {"agent_cache.worker": placement.worker, "agent_cache.placement": placement.outcome,
            "agent_cache.pool": placement.pool}


class _CallTrace:
    def __init__(self, tracer: trace.Tracer, request: RouteRequest, attributes: Mapping[str, Any]) -> None:
        self._tracer = tracer
        operation = str(attributes.get("gen_ai.operation.name", "chat"))
        model = attributes.get("gen_ai.request.model")
        first: dict[str, Any] = {"gen_ai.provider.name": PROVIDER, "gen_ai.system": PROVIDER,
                                 "gen_ai.operation.name": operation, **attributes,
                                 "agent_cache.session.hash": trace_context.session_hash(request.session_id),
                                 "agent_cache.tenant": request.tenant}
        if request.pool is not None:
            first["agent_cache.pool"] = request.pool
        parent: Context | None = trace_context.parent()
        self.span: Span = tracer.start_span(f"{operation} {model}" if model else operation, context=parent,
                                            kind=SpanKind.CLIENT, attributes=first)
        self._attempt: Span | None = None
        self._attempts = 0
        self._usage: Usage | None = None
        self._retry_reason: str | None = None

    def attempt(self, placement: Placement) -> None:
        self._attempts += 1
        attributes: dict[str, Any] = {"agent_cache.attempt": self._attempts, **_placement_attributes(placement)}
        if self._retry_reason is not None:
            attributes["agent_cache.retry_reason"] = self._retry_reason
        self._attempt = span = self._tracer.start_span(
            f"attempt {self._attempts}", context=trace.set_span_in_context(self.span), kind=SpanKind.CLIENT,
            attributes=attributes)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        trace_context.set_outgoing(tuple(carrier.items()))

    def settled(self, placement: Placement, error: BaseException | None, usage: Usage | None) -> None:
        self._end_attempt(error, usage)

    def _end_attempt(self, error: BaseException | None, usage: Usage | None) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        span.set_attributes(_usage_attributes(usage))
        if error is not None:
            self._retry_reason = _error_type(error)
            span.set_attribute("error.type", self._retry_reason)
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        else:
            self._usage = usage
        span.end()

    def end(self, placement: Placement | None, error: BaseException | None) -> None:
        trace_context.set_outgoing(())
        if self._attempt is not None:  # the call stopped inside an attempt (the caller left)
            self._end_attempt(error, None)
        span = self.span
        span.set_attribute("agent_cache.attempts", self._attempts)
        if self._retry_reason is not None:
            span.set_attribute("agent_cache.retry_reason", self._retry_reason)
        if placement is not None:
            span.set_attributes(_placement_attributes(placement))
        span.set_attributes(_usage_attributes(self._usage))
        if error is not None:
            kind = "cancelled" if isinstance(error, GeneratorExit) else _error_type(error)
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        span.end()


class OtelTracer:
    def __init__(self) -> None:
        try:
            version: str | None = importlib.metadata.version("agent-cache")
        except importlib.metadata.PackageNotFoundError:
            version = None
        self._tracer = _provider().get_tracer(_SCOPE, version)

    def start_call(self, request: RouteRequest, attributes: Mapping[str, Any]) -> _CallTrace:
        return _CallTrace(self._tracer, request, attributes)

    def incoming(self, headers: Mapping[str, str]) -> tuple[Any, tuple[tuple[str, str], ...]]:
        if "traceparent" not in headers:
            return None, ()
        parent = propagate.extract(headers)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=parent)
        return parent, tuple(carrier.items())
