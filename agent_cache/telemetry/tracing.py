"""Tracing, configured only by the standard ``OTEL_*`` environment variables; nothing without them.

With the ``agent-cache[otel]`` extra installed, a call (a ``ChatSGLang`` call or one through the gateway)
is traced when the environment asks for traces (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off), or when the application already set up OpenTelemetry's
tracer provider itself. Without either, this module imports no OpenTelemetry package and every hook is
a no-op: :func:`start_call` answers None.

A call gets one span and each of its attempts a child span (:mod:`.otel` builds them); the attempt's
W3C ``traceparent`` goes with the request to the worker (:mod:`.trace_context`), so
SGLang's own tracing joins the trace. The gateway continues the trace of the incoming request
(:func:`continue_incoming`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping, Protocol

from agent_cache.telemetry import trace_context
from agent_cache.values import Placement, RouteRequest, Usage

logger = logging.getLogger("agent_cache.tracing")

class CallTrace(Protocol):
    """What follows one call (its spans, its access log line): its lifecycle tells it each attempt
    and how the call ended."""

    def attempt(self, placement: Placement) -> None: ...

    def settled(self, placement: Placement, error: BaseException | None, usage: Usage | None) -> None: ...

    def end(self, placement: Placement | None, error: BaseException | None) -> None: ...


class Tracer(Protocol):
    def start_call(self, request: RouteRequest, attributes: Mapping[str, Any]) -> CallTrace: ...

    def incoming(self, headers: Mapping[str, str]) -> tuple[Any, tuple[tuple[str, str], ...]]: ...


_UNSET: Any = object()
_tracer: Tracer | None = _UNSET


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (the standard OTEL_* variables)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _configured_by_application() -> bool:
    """The application set up OpenTelemetry's tracer provider (seen without importing anything)."""
    api = sys.modules.get("opentelemetry.trace")
    return api is not None and type(api.get_tracer_provider()).__name__ not in ("ProxyTracerProvider",
                                                                                "NoOpTracerProvider")


def tracer() -> Tracer | None:
    """The process's tracer, decided on first use; None when tracing is off."""
    global _tracer
    if _tracer is _UNSET:
        _tracer = None
        if wanted() or _configured_by_application():
            try:
                from agent_cache.telemetry.otel import OtelTracer
            except ImportError as exc:
                logger.warning("OTEL_* asks for traces but OpenTelemetry is not installed "
                               "(pip install 'agent-cache[otel]'): %s", exc)
            else:
                _tracer = OtelTracer()
    return _tracer


def call_attributes(model: str | None, operation: str) -> dict[str, Any]:
    """The GenAI semantic-convention attributes of a call that its lifecycle does not know."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation}
    if model:
        attributes["gen_ai.request.model"] = model
    return attributes


def start_call(request: RouteRequest, attributes: Mapping[str, Any] | None = None) -> CallTrace | None:
    """The spans of a call now starting; None when tracing is off."""
    t = tracer()
    return None if t is None else t.start_call(request, attributes or {})


def continue_incoming(headers: Mapping[str, str]) -> None:
    """The gateway, as a request arrives: its ``traceparent`` (if any) parents the call's span and goes
    on to the worker until an attempt's span takes over."""
    t = tracer()
    if t is not None:
        parent, outgoing = t.incoming(headers)
        trace_context.set_parent(parent)
        trace_context.set_outgoing(outgoing)
