"""Failures a request causes are the request's, not a worker's: through ``agent-cache serve`` with real
simulated workers and Redis. One tenant's bad requests never take workers out of rotation for another,
a half-open worker takes one trial call, and a Redis outage moves no session."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet
from agent_cache.sim.fleet import ThreadedServer

HOOKS = ["--extra-fields", "sim_fail_status,sim_whole_answer"]


def _gateway(procs: Processes, workers: list[str], redis_url: str, *args: str) -> str:
    gw = AgentCacheGateways(procs, workers, redis_url=redis_url,
                            args=["--prefix", f"t-{uuid.uuid4().hex[:10]}", *HOOKS, *args])
    return gw.urls[0] + "/v1/chat/completions"


def _body(text: str, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": stream,
            **extra}


def _call(client: httpx.Client, url: str, session: str, *, stream: bool = False, **extra: Any) -> httpx.Response:
    return client.post(url, json=_body(f"step of {session}", stream=stream, **extra),
                       headers={"x-session-id": session})


@pytest.mark.slow
def test_bad_requests_of_one_tenant_fail_no_call_of_another_and_move_no_pin(procs, redis_url, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-a team-a\nsk-b team-b\n")
    with SimFleet(3) as fleet:
        url = _gateway(procs, fleet.urls, redis_url, "--api-keys", str(keys))
        a = httpx.Client(headers={"authorization": "Bearer sk-a"}, timeout=30)
        b = httpx.Client(headers={"authorization": "Bearer sk-b"}, timeout=30)
        sessions = [f"a-{i}" for i in range(6)]
        pins = {s: _call(a, url, s).headers["x-agent-cache-worker"] for s in sessions}
        answers: list[tuple[int, str]] = []
        results: list[tuple[str, int, str]] = []
        stop = threading.Event()

        def bad_call(n: int) -> None:  # a 500 every worker gives, or a stream the worker answers whole
            extra = ({"sim_fail_status": 500, "stream": n % 4 == 2} if n % 2 == 0
                     else {"sim_whole_answer": True, "stream": True})
            r = _call(b, url, f"b-{n % 4}", **extra)
            answers.append((r.status_code, r.json()["error"]["code"]))

        def tenant_a(offset: int) -> None:
            k = offset
            while not stop.is_set():
                s = sessions[k % len(sessions)]
                r = _call(a, url, s, stream=k % 2 == 1)
                results.append((s, r.status_code, r.headers.get("x-agent-cache-worker", "")))
                k += 1
                stop.wait(0.25)  # about 10 calls a second in all: fewer than B's bad ones

        good = [threading.Thread(target=tenant_a, args=(i,)) for i in range(3)]
        for t in good:
            t.start()
        try:
            with ThreadPoolExecutor(16) as pool:  # tenant B: 8 bad requests a second, whatever their latency
                start = time.monotonic()
                for n in range(32):
                    time.sleep(max(0.0, start + n / 8 - time.monotonic()))
                    pool.submit(bad_call, n)
        finally:
            stop.set()
            for t in good:
                t.join()
        failed = [r for r in results if r[1] != 200]
        assert len(results) >= 30 and len(failed) / len(results) < 0.01, failed[:5]
        assert {s: w for s, _, w in results} == pins  # no session of team-a moved
        assert all(w == pins[s] for s, _, w in results)
        assert len(answers) == 32
        # answered with the worker's status (the 500 reproduced on a second worker) or a 400, OpenAI-shaped
        assert set(answers) == {(500, "worker_error_reproduced"), (400, "worker_response_mismatch")}
        health = httpx.get(url.replace("/v1/chat/completions", "/metrics")).text
        assert "agent_cache_worker_healthy" not in health or all(
            line.endswith(" 1.0") for line in health.splitlines() if line.startswith("agent_cache_worker_healthy{"))


def _flaky_worker(state: dict[str, Any]):
    """A worker that answers 500 to every call while ``state["bad"]``; its /health says it is fine."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def chat(request):
        await request.body()
        state["hits"].append(time.monotonic())
        if state["bad"]:
            return JSONResponse({"object": "error", "message": "boom", "type": "InternalServerError",
                                 "param": None, "code": 500}, status_code=500)
        return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def health(request):
        return Response(b"")

    return lambda: Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                     Route("/health", health)])


@pytest.mark.slow
def test_a_failing_worker_is_ejected_alone_and_half_open_takes_one_trial(procs, redis_url):
    state: dict[str, Any] = {"bad": True, "hits": []}
    flaky = ThreadedServer(_flaky_worker(state))
    flaky.start()
    try:
        with SimFleet(2) as fleet:
            url = _gateway(procs, [flaky.url, *fleet.urls], redis_url)
            client = httpx.Client(timeout=30)
            # new sessions until the flaky worker has failed three calls: each failure was checked on another
            # worker (a second opinion) that served it, so no call failed
            n = 0
            while len(state["hits"]) < 3:
                assert n < 60, "the flaky worker never got three calls"
                r = _call(client, url, f"new-{n}")
                assert r.status_code == 200, r.text
                n += 1
            ejected_at = time.monotonic()
            # ejected: no new session goes there during its 2 s cooldown
            with ThreadPoolExecutor(9) as pool:
                rs = list(pool.map(lambda i: _call(client, url, f"open-{i}"), range(9)))
            assert all(r.status_code == 200 for r in rs)
            assert len(state["hits"]) == 3 or time.monotonic() - ejected_at > 2.0
            # half-open: bursts of new sessions; the worker takes one trial per half-open spell, never more
            bursts: list[int] = []
            for round_ in range(8):
                time.sleep(0.6)
                before = len(state["hits"])
                with ThreadPoolExecutor(9) as pool:
                    rs = list(pool.map(lambda i: _call(client, url, f"half-{round_}-{i}"), range(9)))
                assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
                bursts.append(len(state["hits"]) - before)
            assert max(bursts) == 1, bursts  # a trial happened, and no burst sent more than one call
    finally:
        flaky.stop()


@pytest.mark.slow
def test_redis_stopped_for_seconds_moves_no_session(procs, redis_server_factory):
    server = redis_server_factory()
    with SimFleet(3) as fleet:
        url = _gateway(procs, fleet.urls, server.url)
        client = httpx.Client(timeout=30)
        sessions = [f"r-{i}" for i in range(9)]
        pins = {s: _call(client, url, s).headers["x-agent-cache-worker"] for s in sessions}
        assert len(set(pins.values())) > 1  # spread over the workers, so the hash would move some
        server.save()
        server.stop()
        try:
            for k in range(3):
                for s in sessions:
                    r = _call(client, url, s, stream=k % 2 == 1)
                    assert r.status_code == 200, r.text
                    assert r.headers["x-agent-cache-worker"] == pins[s], s
                time.sleep(1.0)
        finally:
            server.start()
        for s in sessions:  # and back with the store: still where they were
            assert _call(client, url, s).headers["x-agent-cache-worker"] == pins[s]
