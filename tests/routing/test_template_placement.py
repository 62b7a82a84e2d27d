"""Template-aware placement is never worse than placement without templates in cached tokens, and spreads.

Real Router + MemoryStore against four simulated SGLang workers; 40 agent
sessions x 3 steps over two templates (two ~1k-token system prompts), run
from 8 threads so placements see real in-flight load. The baseline is the
same Router with ``template_id=None`` (no template holders: load only).

The spread is checked on the exact snapshots the decisions saw: the memory
store's ``choose_worker`` is wrapped to record (snapshot, decision) under the
store's lock, so the check is not a racy re-read of the store afterwards.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import agent_cache.store.memory as memory_store
from agent_cache.backends import SGLangClient
from agent_cache.placement.rule import Decision, Policy, Snapshot, choose_worker
from agent_cache.routing.router import RouteRequest, Router
from agent_cache.sim import SimFleet
from agent_cache.templates.templater import token_count

TEMPLATES = {
    "t_support": "You are a support agent for a parcel company. Follow the refund policy exactly. " * 60,
    "t_research": "You are a research agent. Search, read, and cite every claim you make. " * 60,
}
TEMPLATE_TOKENS = {tid: token_count(text) for tid, text in TEMPLATES.items()}
SESSIONS, STEPS, THREADS = 40, 3, 8


def _run(router: Router, urls: list[str], template_aware: bool) -> tuple[int, int, int]:
    clients = {u: SGLangClient(u) for u in urls}

    def session(i: int) -> tuple[int, int, int]:
        tid = list(TEMPLATES)[i % 2]
        history = [{"role": "system", "content": TEMPLATES[tid]}, {"role": "user", "content": f"case {i}"}]
        cached = prompt = first = 0
        for step in range(STEPS):
            request = RouteRequest(f"s{i}", template_id=tid if template_aware else None,
                                   prompt_tokens_estimate=TEMPLATE_TOKENS[tid])  # as ChatSGLang sends it
            result, placement = router.execute(request, lambda url: clients[url].chat(history, max_tokens=8))
            usage = result.usage
            assert usage is not None
            router.report(placement, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens or 0)
            cached += usage.cached_tokens or 0
            prompt += usage.prompt_tokens
            first = first or usage.prompt_tokens
            history += [{"role": "assistant", "content": result.content or ""},
                        {"role": "user", "content": f"step {step}"}]  # fmt: skip
        return cached, prompt, first

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            totals = list(pool.map(session, range(SESSIONS)))
    finally:
        for c in clients.values():
            c.close()
    return sum(t[0] for t in totals), sum(t[1] for t in totals), min(t[2] for t in totals)


def test_template_placement_reuses_and_spreads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Snapshot, Decision]] = []
    seen_lock = threading.Lock()

    def recording(snapshot: Snapshot, session_id: str, policy: Policy = Policy()) -> Decision:
        decision = choose_worker(snapshot, session_id, policy)
        with seen_lock:
            seen.append((snapshot, decision))
        return decision

    monkeypatch.setattr(memory_store, "choose_worker", recording)
    policy = Policy()
    results, outcomes, decisions = {}, {}, {}
    for template_aware in (True, False):
        seen.clear()
        with SimFleet(4) as fleet:
            router = Router(fleet.urls, probe_interval=None, policy=policy)
            try:
                results[template_aware] = _run(router, fleet.urls, template_aware)
                outcomes[template_aware] = router.store.stats(0)["outcomes"]
            finally:
                router.close()
        decisions[template_aware] = list(seen)

    aware_cached, aware_prompt, template_tokens = results[True]
    load_cached, load_prompt, _ = results[False]
    assert template_tokens > 900  # ~1k-token system prompts
    assert aware_prompt == load_prompt  # the same work
    assert outcomes[True].get("placed_template", 0) > 0
    assert outcomes[False].get("placed_template", 0) == 0  # the baseline really is load-only
    # Without templates each template is prefilled on every worker it lands on; with them a holder
    # is preferred while its extra footprint is below the template's length: no fewer hits. The two
    # runs race 8 threads in real time, so which session meets which load differs between them; on a
    # loaded machine that noise reached 0.8 % of the cached tokens, hence the 2 % allowance.
    assert aware_cached >= 0.98 * load_cached, (aware_cached, load_cached)

    # Template reuse does not pile sessions up: every worker took new sessions, none more than twice
    # its share, and some decisions happened under real load.
    for template_aware, recorded in decisions.items():
        placements = [(s, d) for s, d in recorded if d.outcome != "pinned"]
        assert len(placements) == SESSIONS, (template_aware, len(placements))
        per_worker = Counter(d.worker for _, d in placements)
        assert len(per_worker) == 4 and max(per_worker.values()) <= 2 * SESSIONS / 4, per_worker
        busy = sum(any(w.inflight for w in snapshot.workers) for snapshot, _ in placements)
        assert busy > 0, "no placement saw in-flight calls: the workload is not concurrent"


def test_a_trickle_of_one_agents_sessions_uses_the_fleet() -> None:
    """24 sessions of one agent, started one after another (3 steps each), on 4 workers."""
    from langchain_core.messages import HumanMessage, SystemMessage

    from agent_cache import ChatSGLang

    with SimFleet(4, time_scale=0.0) as fleet:
        llm = ChatSGLang(model="qwen", workers=fleet.urls)
        try:
            used: Counter[str] = Counter()
            for i in range(24):
                history = [SystemMessage(TEMPLATES["t_support"]), HumanMessage(f"case {i}")]
                for _ in range(3):
                    reply = llm.invoke(history, session_id=f"s{i}")
                    history += [reply, HumanMessage("the tool says ok")]
                used[reply.response_metadata["worker"]] += 1
        finally:
            llm.close()
    assert len(used) >= 3 and max(used.values()) <= 12, used
