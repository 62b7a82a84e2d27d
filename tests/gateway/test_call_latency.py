"""``agent-cache serve``'s latency series and tokens per tenant, scraped from a real gateway process after
calls of two tenants (API keys) to three simulated workers that take real time (time scale 1): each
call observed once under the worker that served it, and each tenant's tokens the usage its workers
reported."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_cache.server_processes import AgentCacheGateways
from agent_cache.gateway.authz import worker_id
from agent_cache.sim import SimFleet
from tests.conftest import free_port

TTFT = "agent_cache_gen_ai_server_time_to_first_token_seconds"
TPOT = "agent_cache_gen_ai_server_time_per_output_token_seconds"
DURATION = "agent_cache_gen_ai_server_request_duration_seconds"
ROUTE = "agent_cache_route_duration_seconds"
TOKENS = "agent_cache_tenant_tokens_total"
KEYS = {"key-acme": "acme", "key-globex": "globex"}
SYSTEM = "You are a careful research agent. Cite what the tools return. " * 12


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _get(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _buckets(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
             **labels: str) -> dict[float, float]:
    return {float(dict(key)["le"]): value for (n, key), value in samples.items()
            if n == name + "_bucket" and all(dict(key).get(k) == v for k, v in labels.items())}


def _call(url: str, key: str, path: str, body: dict[str, Any], session: str) -> tuple[str, dict[str, int]]:
    """One call: the worker id that served it, and the usage its worker reported (prompt, completion, cached)."""
    headers = {"authorization": f"Bearer {key}", "x-session-id": session}
    if body.get("stream"):
        with httpx.stream("POST", url + path, json=body, headers=headers, timeout=30) as r:
            assert r.status_code == 200, r.read()
            events = [json.loads(line[5:]) for line in r.iter_lines()
                      if line.startswith("data:") and line != "data: [DONE]"]
            worker = r.headers["x-agent-cache-worker"]
        usage = [e["usage"] for e in events if e.get("usage")][-1]
    else:
        r = httpx.post(url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        worker = r.headers["x-agent-cache-worker"]
        answer = r.json()
        if path == "/generate":
            meta = answer["meta_info"]
            usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                     "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]}}
        else:
            usage = answer["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return worker, {"input": usage["prompt_tokens"], "output": usage["completion_tokens"], "cached": cached}


@pytest.mark.slow
def test_a_gateways_calls_are_timed_per_worker_and_its_tenants_tokens_add_up(procs, redis_url, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("".join(f"{key} {tenant}\n" for key, tenant in KEYS.items()))
    metrics_port = free_port()
    with SimFleet(3, time_scale=1.0) as fleet:
        gw = AgentCacheGateways(procs, fleet.urls, redis_url=redis_url, args=[
            "--prefix", f"t-{uuid.uuid4().hex[:10]}", "--api-keys", str(keys), "--metrics-port", str(metrics_port)])
        url = gw.urls[0]
        served: Counter[str] = Counter()
        tokens: dict[str, Counter[str]] = defaultdict(Counter)
        whole: Counter[str] = Counter()  # calls answered in one piece: no time per output token
        for key, tenant in KEYS.items():
            for i in range(3):  # an agent's steps: one session, its prompt growing (the cache serves its start)
                session = f"{tenant}-{i}-{uuid.uuid4().hex[:6]}"
                messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task {i}."}]
                for step in range(3):
                    body: dict[str, Any] = {"model": "m", "messages": messages, "max_tokens": 6}
                    if step % 2:
                        body |= {"stream": True, "stream_options": {"include_usage": True}}
                    worker, usage = _call(url, key, "/v1/chat/completions", body, session)
                    served[worker] += 1
                    tokens[tenant].update(usage)
                    whole[worker] += not body.get("stream")  # sent whole to the worker: its answer comes in one piece
                    messages = [*messages, {"role": "assistant", "content": f"step {step}"},
                                {"role": "user", "content": "go on"}]
            for path, body in (("/v1/completions", {"model": "m", "prompt": SYSTEM, "max_tokens": 6}),
                               ("/v1/completions", {"model": "m", "prompt": SYSTEM, "max_tokens": 6, "stream": True,
                                                    "stream_options": {"include_usage": True}}),
                               ("/generate", {"text": SYSTEM, "sampling_params": {"max_new_tokens": 6}})):
                worker, usage = _call(url, key, path, body, f"{tenant}-text")
                served[worker] += 1
                tokens[tenant].update(usage)
                whole[worker] += not body.get("stream")
        samples = _samples(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text)

    assert sum(served.values()) == 2 * (9 + 3) and len(served) >= 2, served
    ids = {worker_id(u): u for u in fleet.urls}  # callers other than admins see workers by id; /metrics by URL
    for shown, calls in served.items():
        worker = ids[shown]
        assert _get(samples, TTFT + "_count", worker=worker) == calls
        assert _get(samples, DURATION + "_count", worker=worker, outcome="ok") == calls
        assert _get(samples, ROUTE + "_count", worker=worker) == calls
        assert _get(samples, TPOT + "_count", worker=worker) == calls - whole[shown]  # every answer has 6 tokens
        ttft, duration = _buckets(samples, TTFT, worker=worker), _buckets(samples, DURATION, worker=worker,
                                                                           outcome="ok")
        shared = ttft.keys() & duration.keys()
        assert len(shared) >= 4 and all(ttft[le] >= duration[le] for le in shared)  # each TTFT <= its duration
        assert 0 < _get(samples, ROUTE + "_sum", worker=worker) < _get(samples, TTFT + "_sum", worker=worker)
        assert _get(samples, TTFT + "_sum", worker=worker) < _get(samples, DURATION + "_sum", worker=worker,
                                                                   outcome="ok")
    assert not {dict(k).get("outcome") for n, k in samples if n == DURATION + "_count"} - {"ok"}
    for tenant, counted in tokens.items():
        assert counted["cached"] > 0  # the agents' later steps read the cache
        for kind in ("input", "output", "cached"):
            assert _get(samples, TOKENS, tenant=tenant, gen_ai_token_type=kind) == counted[kind], (tenant, kind)
