"""``agent-cache serve`` as a process in front of simulated workers, driven by the official OpenAI client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Iterator

import httpx
import openai
import pytest
import redis

from agent_cache.backends.sglang import SGLangClient
from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.gateway.authz import worker_id
from agent_cache.sim import SimFleet

REDIS = ""  # the suite's private Redis, set by _private_redis before any test runs
TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": f"Tool number {i}.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    for i in range(7)]
SYSTEM = ("You are a research agent. Today is 2026-12-03 14:07:31 UTC. The user is alice@example.com. "
          + "Use the tools in order and report what they return. " * 20)


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(3) as f:
        yield f


@pytest.fixture(scope="module", autouse=True)
def _private_redis(redis_url: str) -> None:
    global REDIS
    REDIS = redis_url


def _gateway(procs: Processes, fleet: SimFleet, *args: str, count: int = 1, redis_url: str | None = None,
             prefix: str | None = None) -> AgentCacheGateways:
    redis_url = redis_url or REDIS  # default: the suite's private Redis
    prefix_args = ["--prefix", prefix or f"t-{uuid.uuid4().hex[:10]}"]
    return AgentCacheGateways(procs, fleet.urls, redis_url=redis_url, count=count, args=[*prefix_args, *args])


def _agent_run(client: openai.OpenAI, session: str, *, stream: bool) -> list[tuple[str, int, int]]:
    """An 8-step tool-calling agent: 7 tool calls (tool_choice required), then the answer.
    Returns (worker, prompt tokens, cached tokens) per step."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"Task {session}: look everything up."}]
    steps = []
    for step in range(8):
        choice = "required" if step < 7 else "auto"  # auto: no tool is named in the task, so it answers
        kwargs: dict[str, Any] = dict(model="m", messages=messages, tools=TOOLS, tool_choice=choice,
                                      max_tokens=16, extra_headers={"x-session-id": session})
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                stream=True, stream_options={"include_usage": True}, **kwargs)
            calls: dict[int, dict[str, Any]] = {}
            text, usage = "", None
            for chunk in raw.parse():
                usage = chunk.usage or usage
                for c in chunk.choices:
                    text += c.delta.content or ""
                    for d in c.delta.tool_calls or []:
                        entry = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                        entry["name"] += (d.function.name or "") if d.function else ""
                        entry["arguments"] += (d.function.arguments or "") if d.function else ""
            tool_calls = [{"id": c["id"], "type": "function",
                           "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
        else:
            raw = client.chat.completions.with_raw_response.create(**kwargs)
            out = raw.parse()
            usage, text = out.usage, out.choices[0].message.content or ""
            tool_calls = [c.model_dump() for c in out.choices[0].message.tool_calls or []]
        assert raw.headers["x-agent-cache-session"] == session
        assert usage is not None and usage.prompt_tokens_details is not None
        steps.append((raw.headers["x-agent-cache-worker"], usage.prompt_tokens,
                      usage.prompt_tokens_details.cached_tokens or 0))
        if step < 7:
            assert len(tool_calls) == 1 and tool_calls[0]["function"]["name"].startswith("tool_")
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            messages.append({"role": "tool", "tool_call_id": tool_calls[0]["id"], "content": f"result {step}"})
        else:
            assert text and not tool_calls
    return steps


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.slow
def test_openai_client_runs_an_agent_on_one_worker_with_the_cache_growing(procs, fleet, stream):
    gw = _gateway(procs, fleet)
    client = openai.OpenAI(base_url=gw.urls[0] + "/v1", api_key="unused", max_retries=0)
    for _ in range(3):
        steps = _agent_run(client, f"s-{uuid.uuid4().hex[:8]}", stream=stream)
        assert len({w for w, _, _ in steps}) == 1, steps
        cached = [c for _, _, c in steps]
        assert all(b > a for a, b in zip(cached, cached[1:])), cached
        # each step reuses the whole previous prompt
        assert all(c >= p for (_, p, _), (_, _, c) in zip(steps, steps[1:])), steps


@pytest.mark.slow
def test_chat_openai_create_agent_sticks_without_a_session_header(procs, fleet):
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    def make(i: int):
        @tool(f"lookup_{i}")
        def lookup(query: str) -> str:
            """Look a fact up."""
            return f"fact {i} about {query}"
        return lookup

    tools = [make(i) for i in range(7)]
    gw = _gateway(procs, fleet)
    model = ChatOpenAI(base_url=gw.urls[0] + "/v1", api_key="unused", model="m", include_response_headers=True,
                       max_retries=0)
    agent = create_agent(model, tools=tools, system_prompt=SYSTEM)
    task = "Use " + ", ".join(f"lookup_{i}" for i in range(7)) + " on 'tides', then answer."
    for run in range(2):
        out = agent.invoke({"messages": [("user", f"Run {run}. {task}")]})
        ais = [m for m in out["messages"] if isinstance(m, AIMessage)]
        assert len(ais) == 8 and all(m.tool_calls for m in ais[:7]) and not ais[7].tool_calls
        workers = {m.response_metadata["headers"]["x-agent-cache-worker"] for m in ais}
        sessions = [m.response_metadata["headers"]["x-agent-cache-session"] for m in ais]
        # step 1 is a session of its own (placed by the rule, here beside the template); from step 2 on, one
        assert len(workers) == 1 and len(set(sessions[1:])) == 1 and sessions[0] != sessions[1]
        assert all(s.startswith("conv-") for s in sessions)
        reads = [m.usage_metadata["input_token_details"]["cache_read"] for m in ais]
        assert all(b > a for a, b in zip(reads, reads[1:])), reads
    # streamed through ChatOpenAI too
    chunks = list(model.stream([("system", SYSTEM), ("user", "hello")], stream_usage=True))
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert len(chunks) > 3 and merged.text and merged.usage_metadata["input_tokens"] > 100


def _keys(prefix: str) -> list[bytes]:
    return list(redis.Redis.from_url(REDIS).scan_iter(match=f"*{prefix}*", count=1000))


@pytest.mark.slow
def test_bad_requests_get_openai_errors_naming_the_field_and_write_nothing(procs, fleet):
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    gw = _gateway(procs, fleet, "--max-body-bytes", "20000", prefix=prefix)
    url = gw.urls[0] + "/v1/chat/completions"
    good = [{"role": "user", "content": "hi"}]
    cases = [
        (b"{not json", 400, "body"),
        (b"[1, 2]", 400, "body"),
        (json.dumps({"model": "m"}).encode(), 400, "messages"),
        (json.dumps({"model": "m", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": "m", "messages": good, "temprature": 0.5}).encode(), 400, "temprature"),
        (json.dumps({"model": "m", "messages": good, "temperature": -1}).encode(), 400, "temperature"),
        (json.dumps({"model": "m", "messages": good, "extra_key": "other-tenant"}).encode(), 400, "extra_key"),
        (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400,
         "messages[0].role"),
        (json.dumps({"model": "m", "messages": good, "user": ""}).encode(), 400, "user"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 30000}]}).encode(), 413, None),
    ]
    for body, status, param in cases:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (body[:80], r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"] == "invalid_request_error"
        assert err["param"] == param, (body[:80], err)
    r = httpx.post(gw.urls[0] + "/v1/completions", json={"model": "m"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert _keys(prefix) == []  # nothing routed, nothing written
    r = httpx.post(url, json={"model": "m", "messages": good, "max_tokens": 4})
    assert r.status_code == 200 and _keys(prefix)


def test_api_keys_map_to_tenants_that_never_share_cached_prompts(procs, tmp_path):
    fleet = SimFleet(1).start()  # one worker: both tenants' calls meet on it
    secret_a, secret_b = "sk-a-" + uuid.uuid4().hex, "sk-b-" + uuid.uuid4().hex
    keys = tmp_path / "keys"
    keys.write_text(f"# key tenant\n{secret_a} team-a\n{secret_b} team-b\n")
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    try:
        _check_tenants(procs, fleet, keys, prefix, secret_a, secret_b)
    finally:
        fleet.stop()


def _check_tenants(procs, fleet, keys, prefix, secret_a, secret_b):
    gw = _gateway(procs, fleet, "--api-keys", str(keys), prefix=prefix)
    url = gw.urls[0] + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}],
            "max_tokens": 4}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": secret_a}):
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    session = {"x-session-id": "shared-name"}
    a1 = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret_a}", **session}).json()
    a2 = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret_a}", **session}).json()
    b1 = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret_b}", **session}).json()
    assert a1["usage"]["prompt_tokens"] > 200
    assert a2["usage"]["prompt_tokens_details"]["cached_tokens"] >= a1["usage"]["prompt_tokens"] - 1
    assert b1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # team-b cannot reach team-a's cache
    client = redis.Redis.from_url(REDIS)
    stored = b"".join(k + json.dumps(client.dump(k).hex()).encode() for k in _keys(prefix))
    assert b"team-a" in stored or b"team-b" in stored
    for secret in (secret_a, secret_b):  # keys are never stored nor logged
        assert secret.encode() not in stored and secret.encode().hex().encode() not in stored
        assert secret not in gw.procs[0].tail(100_000)


@pytest.mark.slow
def test_two_replicas_behind_a_round_robin_keep_every_session_on_one_worker(procs, fleet):
    gw = _gateway(procs, fleet, count=2)
    clients = [openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0) for u in gw.urls]
    seen: dict[str, set[str]] = {}
    for step in range(4):
        for s in range(12):
            session = f"rr-{s}"
            client = clients[(step * 12 + s) % 2]  # every other call lands on the other replica
            r = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"session {s} step {step}"}], max_tokens=4,
                extra_headers={"x-session-id": session})
            seen.setdefault(session, set()).add(r.headers["x-agent-cache-worker"])
    assert all(len(w) == 1 for w in seen.values()), seen
    assert len({next(iter(w)) for w in seen.values()}) > 1  # and the sessions are spread


def test_completions_and_generate_are_sticky_per_session(procs, fleet):
    gw = _gateway(procs, fleet)
    prompt = "Answer the question by thinking step by step.\n" * 30 + "Question: how tall is the tower?\n"
    workers, cached = set(), []
    for step in range(4):
        r = httpx.post(gw.urls[0] + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 8},
                       headers={"x-session-id": "react-text"})
        assert r.status_code == 200, r.text
        workers.add(r.headers["x-agent-cache-worker"])
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        prompt += r.json()["choices"][0]["text"] + f"\nObservation: {step}\nThought:"
    assert len(workers) == 1 and all(b > a for a, b in zip(cached, cached[1:])), cached
    with httpx.stream("POST", gw.urls[0] + "/v1/completions", headers={"x-session-id": "react-text"},
                      json={"model": "m", "prompt": prompt, "max_tokens": 8, "stream": True}) as r:
        assert r.headers["x-agent-cache-worker"] in workers
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and '"usage": {' not in "".join(events)  # no usage chunk unasked
    r = httpx.post(gw.urls[0] + "/generate", headers={"x-session-id": "react-text"},
                   json={"text": prompt, "sampling_params": {"max_new_tokens": 4}})
    assert r.status_code == 200 and r.headers["x-agent-cache-worker"] in workers
    assert r.json()["meta_info"]["cached_tokens"] > 100


@pytest.mark.slow
def test_health_models_and_metrics(procs, fleet):
    gw = _gateway(procs, fleet)
    health = httpx.get(gw.urls[0] + "/health").json()
    assert health["status"] == "ok" and "workers" not in health  # liveness: no worker URL to unauthenticated callers
    models = httpx.get(gw.urls[0] + "/v1/models").json()
    assert models["data"][0]["id"]
    httpx.post(gw.urls[0] + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                       "content": "x"}]})
    text = httpx.get(gw.urls[0] + "/metrics").text
    assert 'agent_cache_gateway_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in text
    assert "agent_cache_routing_decisions_total" in text


@pytest.mark.slow
def test_a_worker_killed_mid_run_fails_no_agent_step(procs):
    # real time: a step decodes for about 0.2 s, long enough to see it running on a worker and kill it there
    with SimFleet(3, time_scale=1.0) as fleet:
        gw = _gateway(procs, fleet)
        client = openai.OpenAI(base_url=gw.urls[0] + "/v1", api_key="unused", max_retries=0, timeout=30)
        sessions = [f"k-{i}" for i in range(6)]
        history = {s: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {s}"}]
                   for s in sessions}
        failures: list[BaseException] = []
        killed: list[str] = []

        def step(s: str, stream: bool) -> str:
            r = client.chat.completions.with_raw_response.create(
                model="m", messages=history[s], max_tokens=24, stream=stream, extra_headers={"x-session-id": s})
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in r.parse() if c.choices)
            else:
                text = r.parse().choices[0].message.content or ""
            assert text
            history[s] += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
            return r.headers["x-agent-cache-worker"]

        first = {s: step(s, False) for s in sessions}
        victim = first[sessions[0]]

        def run(s: str, n: int) -> None:
            try:
                for k in range(n):
                    # whole answers until the kill (an answer cut after its first bytes reached the client
                    # cannot be retried by anyone: which call the kill lands on was a race on a busy
                    # machine); streamed ones alternate after it, placed while the victim is being found down
                    step(s, bool(killed) and k % 2 == 1)
            except BaseException as exc:  # noqa: BLE001 - counted below
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(s, 4)) for s in sessions]
        for t in threads:
            t.start()
        with SGLangClient(victim, timeout=5) as worker:
            deadline = time.monotonic() + 30
            while worker.metrics().get("sglang:num_running_reqs", 0) < 1:  # SGLang's own gauge
                assert time.monotonic() < deadline and any(t.is_alive() for t in threads), \
                    "no call was ever seen running on the victim"
                time.sleep(0.005)
        fleet.stop_worker(fleet.urls.index(victim))  # under the running call (force exit: its connection drops)
        killed.append(victim)
        for t in threads:
            t.join(60)
        assert failures == []
        assert _labelled(gw.urls[0], "agent_cache_failovers_total").get(victim, 0) >= 1  # the cut call was retried on another worker
        after = {s: step(s, False) for s in sessions}
        assert victim not in after.values()


@pytest.mark.slow
def test_redis_killed_mid_run_fails_no_call(procs, fleet, redis_server_factory):
    server = redis_server_factory()
    gw = _gateway(procs, fleet, redis_url=server.url)
    client = openai.OpenAI(base_url=gw.urls[0] + "/v1", api_key="unused", max_retries=0)
    ok = 0
    for i in range(30):
        if i == 10:
            server.stop()
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"call {i}"}],
                                           max_tokens=4, extra_headers={"x-session-id": f"r-{i % 3}"})
        ok += bool(r.choices[0].message.content)
    assert ok == 30


@pytest.mark.slow
def test_saturated_gateway_answers_503_with_retry_after(procs):
    with SimFleet(1, time_scale=1.0) as fleet:
        gw = _gateway(procs, fleet, "--max-concurrency", "1", "--extra-fields", "sim_output")
        url = gw.urls[0] + "/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "x " * 3000}], "max_tokens": 400,
                "sim_output": "word " * 400}  # about 3 s of decoding: the slot stays taken meanwhile
        results: list[httpx.Response] = []
        t = threading.Thread(target=lambda: results.append(httpx.post(url, json=body, timeout=60)))
        t.start()
        deadline = time.monotonic() + 10
        while httpx.get(gw.urls[0] + "/health").json()["inflight"] < 1:  # the first call holds the one slot
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = httpx.post(url, json=body, timeout=60)
        t.join()
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded"
        assert results[0].status_code == 200


def test_sigterm_drains_a_stream_in_flight(procs):
    with SimFleet(1, time_scale=1.0) as fleet:
        gw = _gateway(procs, fleet)
        body = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 48,
                "stream": True}
        with httpx.stream("POST", gw.urls[0] + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            first = next(lines)
            gw.procs[0].popen.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert first.startswith("data:") and "data: [DONE]" in rest  # the stream ran to its end
        content = [json.loads(line[5:])["choices"][0]["delta"].get("content") for line in [first, *rest]
                   if line.startswith("data: {")]
        assert len([c for c in content if c]) > 5
        gw.procs[0].popen.wait(30)
        # uvicorn exits by re-raising the signal once it has drained
        assert gw.procs[0].popen.returncode in (0, -signal.SIGTERM)


def test_pools_from_the_key_or_the_pool_header(procs, tmp_path):
    with SimFleet(3) as fleet:
        keys = tmp_path / "keys"
        keys.write_text("sk-big big-tenant large\nsk-small small-tenant\n")
        gw = AgentCacheGateways(procs, fleet.urls[:2], redis_url=REDIS, args=[
            "--prefix", f"t-{uuid.uuid4().hex[:10]}", "--api-keys", str(keys), "--pool", f"large={fleet.urls[2]}"])
        url = gw.urls[0] + "/v1/chat/completions"

        def worker(key: str, session: str, **headers: str) -> str:
            r = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": session}],
                                      "max_tokens": 4},
                           headers={"authorization": f"Bearer {key}", "x-session-id": session, **headers})
            assert r.status_code == 200, r.text
            return r.headers["x-agent-cache-worker"]

        ids = [worker_id(u) for u in fleet.urls]  # workers are named to keys other than admins' by id
        assert {worker("sk-big", f"b{i}") for i in range(6)} == {ids[2]}
        assert {worker("sk-small", f"s{i}") for i in range(6)} <= set(ids[:2])
        assert worker("sk-small", "h1", **{"x-agent-cache-pool": "large"}) == ids[2]
        r = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                       headers={"authorization": "Bearer sk-small", "x-agent-cache-pool": "nosuch"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-agent-cache-pool"


def test_a_stream_is_passed_on_event_by_event(procs):
    with SimFleet(1, time_scale=1.0) as fleet:
        gw = _gateway(procs, fleet)
        body = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 64,
                "stream": True}
        arrivals = []
        with httpx.stream("POST", gw.urls[0] + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
        # 64 decode steps of the modelled GPU: the events arrive spread over them, not at once at the end
        assert len(arrivals) > 20
        spread = arrivals[-1] - arrivals[0]
        assert spread > 0.05 and arrivals[len(arrivals) // 2] - arrivals[0] > spread / 4


def _broken_worker(kind: str):
    """A worker that answers 200 with something that is not SGLang's: HTML, or a stream of it."""
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        if body.get("stream"):
            async def events():
                yield b"<html>oops</html>\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return Response(b"<html>oops</html>", media_type="text/html")

    async def health(request):
        return Response(b"")

    return lambda: Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                     Route("/health", health)])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_worker_answering_garbage_is_failed_over(procs, stream):
    from agent_cache.sim.fleet import ThreadedServer

    broken = ThreadedServer(_broken_worker("html"))
    broken.start()
    try:
        with SimFleet(1) as fleet:
            gw = AgentCacheGateways(procs, [broken.url, fleet.urls[0]], redis_url=REDIS,
                                    args=["--prefix", f"t-{uuid.uuid4().hex[:10]}"])
            served = set()
            for i in range(6):
                body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4,
                        "stream": stream}
                r = httpx.post(gw.urls[0] + "/v1/chat/completions", json=body, headers={"x-session-id": f"g{i}"})
                assert r.status_code == 200, r.text
                assert "oops" not in r.text and ("data: [DONE]" in r.text if stream else r.json()["choices"])
                served.add(r.headers["x-agent-cache-worker"])
            assert served == {fleet.urls[0]}
    finally:
        broken.stop()


@pytest.mark.slow
def test_session_ids_are_checked_and_echoed_safely(procs, fleet):
    gw = _gateway(procs, fleet)
    url = gw.urls[0] + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    for stream in (False, True):
        r = httpx.post(url, json={**body, "stream": stream, "user": "evil\r\nx-injected: 1"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "user"
        r = httpx.post(url, json={**body, "stream": stream, "user": "用户-42"})
        assert r.status_code == 200 and r.headers["x-agent-cache-session"] == "%E7%94%A8%E6%88%B7-42"
    assert httpx.get(gw.urls[0] + "/health").json()["inflight"] == 0  # nothing held by the refused ones


@pytest.mark.slow
def test_a_client_that_leaves_frees_its_slot_at_once(procs):
    with SimFleet(1, time_scale=1.0) as fleet:
        gw = _gateway(procs, fleet, "--max-concurrency", "2", "--extra-fields", "sim_output")
        body = {"model": "m", "messages": [{"role": "user", "content": "x " * 2000}], "max_tokens": 2000,
                "sim_output": "word " * 2000}  # the simulated model's answer: about 15 s of decoding
        try:  # gives up waiting for a whole answer
            r = httpx.post(gw.urls[0] + "/v1/chat/completions", json=body, timeout=0.3)
            raise AssertionError(f"answered within 0.3 s: {r.status_code} {r.text[:300]}")
        except httpx.ReadTimeout:
            pass
        with httpx.stream("POST", gw.urls[0] + "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert next(r.iter_lines()).startswith("data:")  # reads one event, then hangs up
        deadline = time.monotonic() + 3  # the worker would take 15 s more: the slots come back before
        while httpx.get(gw.urls[0] + "/health").json()["inflight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(gw.urls[0] + "/health").json()["inflight"] == 0


def test_tenant_owned_fields_cannot_be_passed_through_or_collide(procs, fleet, tmp_path):
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "serve", "--workers", fleet.urls[0],
                          "--extra-fields", "sim_output,extra_key"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--extra-fields:" in out.stderr and "extra_key" in out.stderr
    keys = tmp_path / "keys"
    keys.write_text("sk-a team-a\n")
    gw = _gateway(procs, fleet, "--api-keys", str(keys))
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "rid": "r1"}),
                       ("/generate", {"text": "x", "custom_logit_processor": "code"})):
        r = httpx.post(gw.urls[0] + path, json=body, headers={"authorization": "Bearer sk-a"})
        assert r.status_code == 400 and r.json()["error"]["param"] in ("rid", "custom_logit_processor"), r.text


@pytest.mark.slow
def test_a_hung_worker_is_left_after_its_first_byte_deadline(procs):
    from agent_cache.server_processes import SimWorkers

    workers = SimWorkers(procs, 2, time_scale=0.0, capacity_tokens=100_000)
    gw = AgentCacheGateways(procs, workers.urls, redis_url=REDIS,
                            args=["--prefix", f"t-{uuid.uuid4().hex[:10]}", "--first-byte-floor", "1"])
    url = gw.urls[0] + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}

    def step() -> tuple[str, float]:
        t0 = time.perf_counter()
        with httpx.stream("POST", url, json=body, headers={"x-session-id": "hang-1"}, timeout=60) as r:
            assert r.status_code == 200
            text = "".join(r.iter_lines())
        assert "data: [DONE]" in text
        return r.headers["x-agent-cache-worker"], time.perf_counter() - t0

    home = {step()[0] for _ in range(10)}  # a record of first-byte times on the session's worker
    assert len(home) == 1
    hung = workers._procs[workers.urls.index(next(iter(home)))].popen  # noqa: SLF001 - the test owns it
    hung.send_signal(signal.SIGSTOP)
    try:
        worker, took = step()
        assert worker not in home and took < 1.0 + 0.2 + 3.0, took  # the floor, the backoff, the retry
    finally:
        hung.send_signal(signal.SIGCONT)


def _labelled(url: str, metric: str) -> dict[str, float]:
    """A gateway counter with one label, by that label's value."""
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(metric + "{"):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


def _early_sends(url: str) -> dict[str, float]:
    return _labelled(url, "agent_cache_gateway_early_sends_total")


def test_a_session_call_goes_out_before_the_route_and_follows_a_pin_another_replica_moved(procs, fleet):
    from agent_cache.routing import RouteRequest, Router

    prefix = f"t-{uuid.uuid4().hex[:10]}"
    gw = _gateway(procs, fleet, prefix=prefix)
    session = f"s-{uuid.uuid4().hex[:8]}"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]

    def call() -> httpx.Response:
        r = httpx.post(gw.urls[0] + "/v1/chat/completions", headers={"x-session-id": session},
                       json={"model": "m", "messages": messages, "max_tokens": 4})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        return r

    first = call().headers["x-agent-cache-worker"]
    assert _early_sends(gw.urls[0]) == {}  # the first call of a session waits for the route
    assert [call().headers["x-agent-cache-worker"] for _ in range(3)] == [first] * 3
    assert _early_sends(gw.urls[0]) == {"confirmed": 3.0}
    other = Router(fleet.urls, redis_url=REDIS, prefix=prefix, probe_interval=None)
    moved = other.route(RouteRequest(session), exclude={first})  # another replica moves the session
    other.done(moved)
    other.close()
    assert moved.worker != first
    assert call().headers["x-agent-cache-worker"] == moved.worker  # the early send to `first` is dropped
    assert _early_sends(gw.urls[0]) == {"confirmed": 3.0, "dropped": 1.0}
    assert call().headers["x-agent-cache-worker"] == moved.worker
    assert _early_sends(gw.urls[0]) == {"confirmed": 4.0, "dropped": 1.0}
    with httpx.stream("POST", gw.urls[0] + "/v1/chat/completions", headers={"x-session-id": session},
                      json={"model": "m", "messages": messages, "max_tokens": 4, "stream": True}) as r:
        body = b"".join(r.iter_bytes())
        assert r.headers["x-agent-cache-worker"] == moved.worker
    assert body.rstrip().endswith(b"data: [DONE]") and b'"content"' in body
    assert _early_sends(gw.urls[0]) == {"confirmed": 5.0, "dropped": 1.0}
