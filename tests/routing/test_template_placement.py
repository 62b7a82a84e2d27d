"""Template-aware placement beats least-load placement in cached tokens, within the load bound."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from agent_cache.backends import SGLangClient
from agent_cache.routing.placement import Policy
from agent_cache.routing.router import RouteRequest, Router
from agent_cache.sim import SimFleet

TEMPLATES = {
    "t_support": "You are a support agent for a parcel company. Follow the refund policy exactly. " * 40,
    "t_research": "You are a research agent. Search, read, and cite every claim you make. " * 40,
}


def _run(router: Router, urls: list[str], template_aware: bool) -> tuple[int, int, list[tuple[float, float]]]:
    clients = {u: SGLangClient(u) for u in urls}
    policy = router.policy
    checks: list[tuple[float, float]] = []

    def session(i: int) -> tuple[int, int]:
        tid = list(TEMPLATES)[i % 2]
        history = [{"role": "system", "content": TEMPLATES[tid]}, {"role": "user", "content": f"case {i}"}]
        cached = prompt = 0
        for step in range(3):
            request = RouteRequest(f"s{i}", template_id=tid if template_aware else None)
            if step == 0:  # the load picture the placement saw, to check the bound
                workers = router.store.stats(time.time())["workers"]
                loads = {u: w["inflight"] + policy.kv_weight * w["kv_tokens"] / 200_000 for u, w in workers.items()}
            result, placement = router.execute(request, lambda url: clients[url].chat(history, max_tokens=8))
            usage = result.usage
            assert usage is not None
            router.report(placement, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens or 0)
            if step == 0 and placement.outcome == "placed_template" and loads:
                mean = sum(loads.get(u, 0.0) for u in urls) / len(urls)
                checks.append((loads.get(placement.worker, 0.0), (1 + policy.epsilon) * mean + policy.slack))
            cached += usage.cached_tokens or 0
            prompt += usage.prompt_tokens
            history += [{"role": "assistant", "content": result.content or ""},
                        {"role": "user", "content": f"step {step}"}]
        return cached, prompt

    with ThreadPoolExecutor(4) as pool:
        totals = list(pool.map(session, range(40)))
    for c in clients.values():
        c.close()
    return sum(t[0] for t in totals), sum(t[1] for t in totals), checks


def test_template_aware_beats_least_load_within_bound() -> None:
    results = {}
    for template_aware in (True, False):
        with SimFleet(4) as fleet:
            router = Router(fleet.urls, probe_interval=None, policy=Policy())
            results[template_aware] = _run(router, fleet.urls, template_aware)
            outcomes = router.store.stats(time.time())["outcomes"]
            router.close()
        if template_aware:
            assert outcomes.get("placed_template", 0) > 0
    aware_cached, aware_prompt, checks = results[True]
    load_cached, load_prompt, _ = results[False]
    assert aware_prompt == load_prompt  # the same work
    # each template's system prompt is computed about once instead of once per worker it lands on
    recomputed_aware, recomputed_load = aware_prompt - aware_cached, load_prompt - load_cached
    assert aware_cached > load_cached
    assert recomputed_load > 1.5 * recomputed_aware, (recomputed_aware, recomputed_load)
    assert checks and all(load <= bound for load, bound in checks), checks
