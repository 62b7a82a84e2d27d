"""A long prompt's prefill is the request's own time: it counts against no worker, is not retried,
and moves no other tenant's session (simulated workers in real time: a 100,000-token prompt takes
about 6 s to its first token)."""

from __future__ import annotations

import random
import threading

import httpx
import pytest

from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

WORDS = ["alpha", "beta", "gamma", "delta", "omega"]


def _failures(metrics: str) -> float:
    """Calls counted against a worker (retried elsewhere for a failure of the worker's own)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("agent_cache_failovers_total"))


@pytest.mark.slow
def test_long_prompts_count_against_no_worker_and_move_no_session(procs, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-a team-a\nsk-b team-b\nsk-admin ops role=admin\n")
    with SimFleet(2, time_scale=1) as fleet:
        gw = AgentCacheGateways(procs, fleet.urls, args=["--api-keys", str(keys)]).urls[0]
        admin = {"authorization": "Bearer sk-admin"}
        workers: dict[int, set[str]] = {i: set() for i in range(4)}
        failed: list[int] = []
        stop = threading.Event()

        def session(i: int) -> None:  # tenant A: short streamed steps of 4 sessions
            with httpx.Client(timeout=120, headers={"authorization": "Bearer sk-a", "x-session-id": f"a-{i}"}) as c:
                n = 0
                while not stop.is_set():
                    body = {"model": "m", "stream": True, "max_tokens": 8,
                            "messages": [{"role": "user", "content": f"session {i} step {n}"}]}
                    with c.stream("POST", gw + "/v1/chat/completions", json=body) as r:
                        r.read()
                        if r.status_code != 200:
                            failed.append(r.status_code)
                        workers[i].add(r.headers.get("x-agent-cache-worker", ""))
                    n += 1

        threads = [threading.Thread(target=session, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        # until every worker has enough short calls for its adaptive first-byte deadline
        httpx.get(gw + "/health", timeout=5)
        threading.Event().wait(8)
        for i in workers:
            workers[i].clear()
        before = _failures(httpx.get(gw + "/metrics", headers=admin).text)
        long_calls: list[httpx.Response] = []

        def tenant_b() -> None:
            text = " ".join(random.choice(WORDS) for _ in range(100_000))
            long_calls.append(httpx.post(gw + "/v1/chat/completions", timeout=120, headers={"authorization": "Bearer sk-b"},
                                         json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}))

        b = [threading.Thread(target=tenant_b) for _ in range(2)]
        for t in b:
            t.start()
        for t in b:
            t.join(120)
        stop.set()
        for t in threads:
            t.join(60)
        after = _failures(httpx.get(gw + "/metrics", headers=admin).text)
    assert [r.status_code for r in long_calls] == [200, 200], [r.text[:200] for r in long_calls]
    assert not failed, failed
    assert after == before, f"{after - before} calls counted against workers"
    assert all(len(seen) == 1 for seen in workers.values()), workers  # no session of A's moved
