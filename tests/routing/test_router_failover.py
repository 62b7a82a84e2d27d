"""Failover against simulated SGLang workers: a worker dies mid-session and returns."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_cache.errors import WorkerBadRequestError
from agent_cache.routing import RouteRequest, Router

SYSTEM = "You are a research agent. Use the tools. " * 40


def step(clients, history):
    def call(url):
        r = clients(url).chat(history, max_tokens=8)
        return r

    return call


def run_step(router, clients, sid, history, template=None):
    result, placement = router.execute(RouteRequest(sid, template), step(clients, history))
    u = result.usage
    router.report(placement, prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens or 0)
    history.append({"role": "assistant", "content": result.content or ""})
    history.append({"role": "user", "content": f"observation {len(history)}"})
    return placement


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_worker_killed_mid_session_only_its_sessions_move(fleet, clients):
    router = Router(fleet.urls, probe_interval=0.1, cooldown=0.2)
    try:
        sessions = {f"s{i}": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {i}"}]
                    for i in range(24)}  # fmt: skip
        pins = {sid: run_step(router, clients, sid, h).worker for sid, h in sessions.items()}
        assert len(set(pins.values())) == 3, "least-load placement spreads untemplated sessions"
        dead = fleet.urls[0]
        fleet.stop_worker(0)
        after = {sid: run_step(router, clients, sid, h) for sid, h in sessions.items()}  # no call fails
        for sid, p in after.items():
            if pins[sid] == dead:
                assert p.worker != dead and p.outcome == "moved:unhealthy" and p.epoch == 2
            else:
                assert (p.worker, p.outcome) == (pins[sid], "pinned")
        # the moved sessions hit their new worker's cache from the next step on
        p = run_step(router, clients, next(s for s in pins if pins[s] == dead), sessions[next(s for s in pins if pins[s] == dead)])
        assert p.outcome == "pinned"
        fleet.start_worker(0)
        wait_for(lambda: router.health.state(dead) == "closed")
        new = [run_step(router, clients, f"n{i}", [{"role": "user", "content": f"fresh {i}"}]) for i in range(6)]
        assert any(p.worker == dead for p in new), "the returned worker takes new sessions"
        assert sum(router.store.stats(time.time())["workers"][u]["inflight"] for u in fleet.urls) == 0
    finally:
        router.close()


def test_non_retryable_error_propagates_and_releases(fleet):
    router = Router(fleet.urls, probe_interval=None)

    def bad(url):
        raise WorkerBadRequestError("bad request", url=url, status=400)

    with pytest.raises(WorkerBadRequestError):
        router.execute(RouteRequest("s1"), bad)
    assert all(w["inflight"] == 0 for w in router.store.stats(time.time())["workers"].values())
    assert all(router.health.state(u) == "closed" for u in fleet.urls)  # a bad request says nothing of health
    assert router.store.get_session("default", "s1", time.time()) is None  # the rejected call left no pin
    router.close()


def test_all_workers_down_raises_the_backend_error(fleet, clients):
    router = Router(fleet.urls, probe_interval=None, max_attempts=5)
    for i in range(3):
        fleet.stop_worker(i)
    from agent_cache.errors import WorkerConnectionError

    with pytest.raises(WorkerConnectionError):
        router.execute(RouteRequest("s1"), step(clients, [{"role": "user", "content": "x"}]))
    assert all(w["inflight"] == 0 for w in router.store.stats(time.time())["workers"].values())
    router.close()


async def test_aexecute_fails_over(fleet):
    from agent_cache.backends.sglang import AsyncSGLangClient

    router = Router(fleet.urls, probe_interval=None)
    clients = {u: AsyncSGLangClient(u, timeout=5.0) for u in fleet.urls}
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]

    async def call(url):
        return await clients[url].chat(msgs, max_tokens=4)

    _, first = await router.aexecute(RouteRequest("a1", "research"), call)
    idx = fleet.urls.index(first.worker)
    await asyncio.to_thread(fleet.stop_worker, idx)
    result, moved = await router.aexecute(RouteRequest("a1", "research"), call)
    assert moved.worker != first.worker and moved.outcome == "moved:unhealthy"
    await router.areport(moved, prompt_tokens=result.usage.prompt_tokens, cached_tokens=0)
    for c in clients.values():
        await c.aclose()
    router.close()
