"""``agent-cache serve --kv-events``: the gateway learns its templates' tokens from the workers and places
new sessions where the workers' KV events say the template is, not where its own marks say it once was."""

from __future__ import annotations

import json
import re
import uuid
from typing import Iterator

import httpx
import pytest

from agent_cache.processes import Processes, free_port, wait_until
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimWorkerThread, WorkerOptions

SYSTEM = " ".join(f"Rule {i}: read the ticket, check file {i * 7 % 13}.py and cite line {i * 11}." for i in range(60))
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture
def workers() -> Iterator[list[tuple[SimWorkerThread, str]]]:
    out = []
    try:
        for _ in range(2):
            pub, replay = free_port(), free_port()
            config = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
            w = SimWorkerThread(WorkerOptions(time_scale=0.0, kv_events_config=json.dumps(config)))
            w.start()
            out.append((w, f"{w.url}=tcp://127.0.0.1:{pub}|tcp://127.0.0.1:{replay}"))
        yield out
    finally:
        for w, _ in out:
            w.stop()


def _metric(text: str, name: str, worker: str | None = None) -> float | None:
    label = "" if worker is None else re.escape(f'{{worker="{worker}"}}')
    found = re.search(rf"^{name}{label} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def _wait(gateway: str, ok, what: str) -> None:
    wait_until(lambda: ok(httpx.get(gateway + "/metrics").text), [], f"{what} in the gateway's /metrics", timeout=15.0)


def _chat(client: httpx.Client, session: str, user: str) -> str:
    body = {"model": "m", "max_tokens": 4, "tools": TOOLS,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}
    r = client.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
    assert r.status_code == 200, r.text
    return r.headers["x-agent-cache-worker"]


@pytest.mark.parametrize("kv_events", [True, False])
@pytest.mark.slow
def test_a_new_session_goes_where_the_events_say_the_template_is(workers, kv_events: bool) -> None:
    urls = [w.url for w, _ in workers]
    args = ["--kv-events", ",".join(src for _, src in workers)] if kv_events else []
    with Processes() as procs, httpx.Client(timeout=30) as direct:
        gw = AgentCacheGateways(procs, urls, args=[*args, "--prefix", f"t-{uuid.uuid4().hex[:8]}"])
        with httpx.Client(base_url=gw.urls[0], timeout=30) as client:
            first = _chat(client, "s1", "Fix the bug in the parser.")
            other = next(u for u in urls if u != first)
            if kv_events:  # the template's tokens, asked of a worker after the first call
                _wait(gw.urls[0], lambda m: _metric(m, "agent_cache_kv_templates") == 1.0, "a learnt template")
            # the template leaves the worker the gateway placed it on, and is computed on the other one
            direct.post(first + "/flush_cache").raise_for_status()
            body = {"model": "m", "max_tokens": 2, "tools": TOOLS,
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Warm up."}]}
            direct.post(other + "/v1/chat/completions", json=body).raise_for_status()
            if kv_events:
                _wait(gw.urls[0], lambda m: _metric(m, "agent_cache_kv_cached_tokens", first) == 0.0
                      and (_metric(m, "agent_cache_kv_cached_tokens", other) or 0) > 1000, "the flush and the prefill")
            second = _chat(client, "s2", "Add a test for the lexer.")
            metrics = httpx.get(gw.urls[0] + "/metrics").text
    # with events: where the template is now; without: where the gateway's own mark says it was
    assert second == (other if kv_events else first)
    if kv_events:
        assert _metric(metrics, "agent_cache_kv_token_lookups_failed_total") == 0.0
        assert _metric(metrics, "agent_cache_kv_undecodable_total") == 0.0
        assert (_metric(metrics, "agent_cache_kv_batches_total") or 0) >= 3


def test_the_gateway_learns_a_sessions_last_message_and_finds_it_evicted(workers) -> None:
    """Every served call's last message is tokenized by its worker: once the worker's events show it
    gone (a flush here), the session's next route knows it before that call reports a miss."""
    urls = [w.url for w, _ in workers]
    ticket = " ".join(f"Line {i}: TypeError in parse_row at column {i * 3}, value {i * 13 % 97}." for i in range(30))
    with Processes() as procs, httpx.Client(timeout=30) as direct:
        gw = AgentCacheGateways(procs, urls, args=["--kv-events", ",".join(src for _, src in workers),
                                                   "--prefix", f"t-{uuid.uuid4().hex[:8]}"])
        with httpx.Client(base_url=gw.urls[0], timeout=30) as client:
            worker = _chat(client, "s1", ticket)
            _wait(gw.urls[0], lambda m: _metric(m, "agent_cache_kv_sessions") == 1.0
                  and (_metric(m, "agent_cache_kv_cached_tokens", worker) or 0) > 1000, "the last message learnt")
            assert _chat(client, "s1", ticket) == worker  # resident: pinned, and seen there
            direct.post(worker + "/flush_cache").raise_for_status()
            _wait(gw.urls[0], lambda m: _metric(m, "agent_cache_kv_cached_tokens", worker) == 0.0, "the flush")
            metrics = httpx.get(gw.urls[0] + "/metrics").text
            assert _metric(metrics, "agent_cache_kv_prefixes_gone_total") == 0.0
            _chat(client, "s1", ticket)
            metrics = httpx.get(gw.urls[0] + "/metrics").text
    assert _metric(metrics, "agent_cache_kv_prefixes_gone_total") == 1.0
    assert _metric(metrics, "agent_cache_kv_token_lookups_failed_total") == 0.0


def test_publishers_are_named_by_the_workers_urls_as_the_gateway_normalises_them() -> None:
    from agent_cache.errors import ConfigError
    from agent_cache.gateway import GatewayConfig
    from agent_cache.kv import parse_sources

    sources = parse_sources("http://w0:30000/v1=tcp://w0:5557")
    GatewayConfig([{"url": "http://w0:30000/v1/", "pool": "big"}], kv_events=sources)  # the same worker
    with pytest.raises(ConfigError, match="not among the workers") as err:
        GatewayConfig(["http://w1:30000"], kv_events=sources)
    assert err.value.field == "kv_events"
