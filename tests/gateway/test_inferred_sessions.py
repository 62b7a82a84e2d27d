"""Calls without a session header through ``agent-cache serve``: many conversations opening alike do not
hot-spot one worker, and each sticks to its worker once it diverges."""

from __future__ import annotations

import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

SYSTEM = "You are a helpful assistant for a chat front-end. Answer briefly and politely. " * 8
CONVERSATIONS, STEPS = 200, 3


@pytest.fixture
def fleet() -> Iterator[SimFleet]:
    with SimFleet(4) as f:
        yield f


def _spread(calls: dict[int, list[str]]) -> tuple[float, float]:
    """(the busiest worker's share of all calls, the share of conversations whose steps 2.. share a worker)."""
    counts = Counter(w for workers in calls.values() for w in workers)
    busiest = max(counts.values()) / sum(counts.values())
    stuck = sum(len(set(workers[1:])) == 1 for workers in calls.values()) / len(calls)
    return busiest, stuck


@pytest.mark.slow
def test_conversations_sharing_their_start_spread_and_stick(fleet, redis_url):
    with Processes() as procs:
        gw = AgentCacheGateways(procs, fleet.urls, redis_url=redis_url,
                                args=["--prefix", f"t-{uuid.uuid4().hex[:10]}"])
        convs: dict[int, list[dict[str, Any]]] = {
            i: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}]
            for i in range(CONVERSATIONS)}
        workers: dict[int, list[str]] = {i: [] for i in convs}
        with httpx.Client(base_url=gw.urls[0], timeout=30) as client:

            def step(i: int, k: int) -> None:
                r = client.post("/v1/chat/completions", json={"model": "m", "messages": convs[i], "max_tokens": 8})
                assert r.status_code == 200, r.text
                assert r.headers["x-agent-cache-session"].startswith("conv-")
                workers[i].append(r.headers["x-agent-cache-worker"])
                convs[i].append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                convs[i].append({"role": "user", "content": f"Question {k} of conversation {i}."})

            for k in range(STEPS):  # the conversations advance together, as users of a chat front-end do
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda i: step(i, k), convs))
    busiest, stuck = _spread(workers)
    print(f"busiest worker {busiest:.1%} of calls; steps 2-3 on one worker: {stuck:.1%}")
    assert busiest <= 0.40, Counter(w for ws in workers.values() for w in ws)
    assert stuck >= 0.95, stuck
