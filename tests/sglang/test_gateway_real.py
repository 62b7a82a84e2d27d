"""``agent-cache serve`` in front of real SGLang workers: whole and streamed calls (OpenAI SDK), an agent
session's cached prefix growing on one worker, failover when that worker is killed mid-session."""

from __future__ import annotations

from typing import Iterator

import httpx
import openai
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.gateway.authz import worker_id
from agent_cache.sglang_cpu.workers import RealWorker, RealWorkers
from tests.sglang.conftest import MODEL

SYSTEM = "You are a support agent for ACME. " + " ".join(
    f"Policy {i}: refunds over {i * 10} euros need a ticket number." for i in range(40))


@pytest.fixture
def gateway(real_pair: list[RealWorker]) -> Iterator[str]:
    with Processes() as procs:
        yield AgentCacheGateways(procs, [w.url for w in real_pair]).urls[0]


def _step(client: httpx.Client, session: str, messages: list[dict[str, str]]) -> tuple[str, int, int, str]:
    r = client.post("/v1/chat/completions", headers={"x-session-id": session},
                    json={"model": MODEL, "max_tokens": 8, "messages": messages})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return r.headers["x-agent-cache-worker"], usage["prompt_tokens"], cached, r.json()["choices"][0]["message"][
        "content"] or ""


def test_whole_and_streamed_calls_through_the_openai_sdk(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="none")
    whole = client.chat.completions.create(model=MODEL, max_tokens=6,
                                           messages=[{"role": "user", "content": "hello gateway"}])
    assert whole.usage is not None and whole.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model=MODEL, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "stream please"}])
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_an_agent_session_grows_its_cached_prefix_on_one_worker(gateway: str) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Refund order 1234, please."}]
    seen = []
    with httpx.Client(base_url=gateway, timeout=120) as client:
        for step in range(4):
            worker, prompt, cached, answer = _step(client, "gw-real-session", messages)
            seen.append((worker, prompt, cached))
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": f"Tool result {step}: order 1234 is eligible."}]
    assert len({w for w, _, _ in seen}) == 1, seen
    for (_, prev_prompt, _), (_, _, cached) in zip(seen, seen[1:]):
        assert cached >= prev_prompt - 1, seen


def test_a_killed_worker_mid_session_fails_over_and_the_session_goes_on(engine, real_pair: list[RealWorker]) -> None:
    # the gateway names a worker by its URL to an admin (an open gateway's callers are), else by its id
    by_name = {name: w for w in real_pair for name in (w.url, worker_id(w.url))}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Cancel order 77."}]
    for w in real_pair:  # other tests sent this system prompt: no worker may hold the session's prefix yet
        httpx.post(w.url + "/flush_cache", timeout=30).raise_for_status()
    with RealWorkers(engine) as fleet, Processes() as procs, httpx.Client(timeout=120) as client:
        gw = AgentCacheGateways(procs, [w.url for w in real_pair]).urls[0]
        client.base_url = httpx.URL(gw)
        first, _, _, answer = _step(client, "gw-real-failover", messages)
        victim = by_name[first]
        fleet.kill(victim)
        try:
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And order 78?"}]
            second, _, cached, _ = _step(client, "gw-real-failover", messages)
            assert second != first and cached < 50  # a cold worker: nothing of the session cached there
            messages += [{"role": "user", "content": "Thanks."}]
            third, prompt, cached, _ = _step(client, "gw-real-failover", messages)
            assert third == second and cached > 50  # pinned anew: the new worker's cache serves the session
        finally:
            fleet.restart(victim)
