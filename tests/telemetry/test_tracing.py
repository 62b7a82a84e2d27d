"""OpenTelemetry spans of ``agent-cache serve`` and of ``ChatSGLang``, configured by OTEL_* only: real
processes export to an OTLP/HTTP receiver the test runs, and the worker receives the attempt's
``traceparent``."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from typing import Iterator

import httpx
import pytest

pytest.importorskip("opentelemetry.proto")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from agent_cache.processes import wait_until  # noqa: E402
from agent_cache.sim.fleet import ThreadedServer  # noqa: E402
from agent_cache.sim.server import SimServer, WorkerOptions  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.telemetry.otlp_receiver import OtlpReceiver, ReceivedSpan, RecordingWorker  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SYSTEM = "You are a careful research agent. " * 40
CLIENT = 3  # SpanKind CLIENT in OTLP


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def _worker(fail_first: int = 0) -> tuple[ThreadedServer, RecordingWorker]:
    recording = RecordingWorker(SimServer(WorkerOptions()).app, fail_first=fail_first)
    server = ThreadedServer(lambda: recording)
    server.start()
    return server, recording


def _otel_env(monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms, not 5 s
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")


def _session_hash(session: str) -> str:
    return hashlib.sha256(session.encode()).hexdigest()[:16]


def _calls(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if "agent_cache.attempts" in s.attributes]


def test_gateway_call_and_attempt_spans_reach_an_otlp_receiver_and_the_worker_gets_traceparent(
        procs, receiver, monkeypatch):
    server, worker = _worker(fail_first=1)  # the first call's first attempt gets a 503: retried
    try:
        _otel_env(monkeypatch, receiver)
        port = free_port()
        proc = procs.start("serve", [sys.executable, "-m", "agent_cache.cli", "serve", "--port", str(port),
                                     "--workers", server.url])
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(url + "/health", timeout=2.0).status_code == 200, [proc], "agent-cache serve",
                   timeout=60.0)
        body = {"model": "sim-model", "max_tokens": 8,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "step one"}]}
        headers = {"x-session-id": "agent-7", "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        for stream in (False, True):
            r = httpx.post(url + "/v1/chat/completions", json={**body, "stream": stream}, headers=headers,
                           timeout=30.0)
            assert r.status_code == 200, r.text

        spans = receiver.wait_for(lambda s: len(_calls(s)) == 2)
    finally:
        server.stop()

    first, second = sorted(_calls(spans), key=lambda s: s.attributes["agent_cache.attempts"], reverse=True)
    for call in (first, second):
        a = call.attributes
        assert call.name == "chat sim-model" and call.kind == CLIENT
        assert call.trace_id == TRACE_ID and call.parent_span_id == PARENT_ID  # continues the caller's trace
        assert call.resource["service.name"] == "gateway-under-test"
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "sim-model"
        assert a["gen_ai.provider.name"] == "sglang"
        assert a["gen_ai.usage.input_tokens"] > 200 and 0 < a["gen_ai.usage.output_tokens"] <= 8
        assert a["agent_cache.session.hash"] == _session_hash("agent-7")
        assert a["agent_cache.tenant"] == "default" and a["agent_cache.worker"] == server.url
        assert a["agent_cache.placement"] in ("pinned", "placed_least_load", "placed_template", "last_resort")
    assert first.attributes["agent_cache.attempts"] == 2 and first.status_code == 0  # the 503, then an answer
    assert second.attributes["agent_cache.attempts"] == 1 and "agent_cache.retry_reason" not in second.attributes
    assert second.attributes["agent_cache.cached_tokens"] > 200  # the session's prefix, cached by the first call
    assert second.attributes["gen_ai.usage.cache_read_input_tokens"] == second.attributes["agent_cache.cached_tokens"]

    attempts = [s for s in spans if s.name.startswith("attempt ")]
    assert len(attempts) == 3 and all(s.trace_id == TRACE_ID for s in attempts)
    failed = [s for s in attempts if s.attributes.get("error.type")]
    assert len(failed) == 1 and failed[0].parent_span_id == first.span_id and failed[0].status_code == 2
    assert first.attributes["agent_cache.retry_reason"] == failed[0].attributes["error.type"]
    print("retry reason:", failed[0].attributes["error.type"])
    # each request to the worker carried its attempt's span as the parent: SGLang's spans join the trace
    sent = [h["traceparent"].split("-")[1:3] for h in worker.headers]
    assert sorted(sent) == sorted([TRACE_ID, s.span_id] for s in attempts)


@pytest.mark.slow
def test_chat_sglang_emits_the_same_spans(receiver, monkeypatch):
    server, worker = _worker()
    try:
        _otel_env(monkeypatch, receiver)
        script = textwrap.dedent(f"""
            import asyncio
            from agent_cache import ChatSGLang
            model = ChatSGLang(model="sim-model", workers=[{server.url!r}], max_tokens=8)
            messages = [("system", {SYSTEM!r}), ("user", "hello")]
            config = {{"configurable": {{"session_id": "s-9"}}}}
            model.invoke(messages, config=config)
            asyncio.run(model.ainvoke(messages, config=config))
            list(model.stream(messages, config=config))
        """)
        subprocess.run([sys.executable, "-c", script], check=True, timeout=60)  # spans are flushed at exit
        spans = receiver.wait_for(lambda s: len(_calls(s)) == 3)
    finally:
        server.stop()
    calls = _calls(spans)  # sync, async and streamed
    assert all(c.name == "chat sim-model" and c.attributes["gen_ai.request.model"] == "sim-model" for c in calls)
    assert all(c.attributes["agent_cache.worker"] == server.url and c.attributes["agent_cache.attempts"] == 1
               for c in calls)
    assert max(c.attributes.get("agent_cache.cached_tokens", 0) for c in calls) > 200
    assert all(c.attributes["gen_ai.usage.input_tokens"] > 200 for c in calls)
    attempts = [s for s in spans if s.name.startswith("attempt ")]
    assert len(attempts) == 3 and all(a.parent_span_id in {c.span_id for c in calls} for a in attempts)
    assert all(c.attributes["agent_cache.session.hash"] == _session_hash("s-9") for c in calls)
    assert sorted(h["traceparent"].split("-")[1:3] for h in worker.headers) == sorted(
        [s.trace_id, s.span_id] for s in attempts)


@pytest.mark.slow
def test_without_otel_variables_tracing_is_off_and_the_gateway_imports_no_opentelemetry(worker):
    script = textwrap.dedent(f"""
        import os, sys
        for k in [k for k in os.environ if k.startswith("OTEL_")]:
            del os.environ[k]
        from agent_cache.gateway import GatewayConfig, create_app
        create_app(GatewayConfig([{worker!r}]))
        assert not [m for m in sys.modules if m.startswith("opentelemetry")]
        from agent_cache import ChatSGLang
        from agent_cache.telemetry import tracing
        ChatSGLang(model="m", workers=[{worker!r}], max_tokens=4).invoke("hi")
        # (langsmith, under LangChain, imports opentelemetry by itself when it is installed)
        assert tracing.tracer() is None and "agent_cache.telemetry.otel" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


@pytest.mark.parametrize("env, on", [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
])
def test_the_standard_variables_decide_whether_calls_are_traced(env, on):
    from agent_cache.telemetry.tracing import wanted

    assert wanted(env) is on
