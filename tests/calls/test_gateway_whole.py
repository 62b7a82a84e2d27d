"""A whole call through the gateway: sent whole, the worker's own answer passed on; a streamed call
answered whole is the request's fault (400); a whole answer longer than its deadline is waited for
while the worker answers its /health (a hung worker's is left: tests/calls/test_hung_worker.py)."""

from __future__ import annotations

import time
from typing import Iterator

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways, SimWorkers
from agent_cache.sim import SimFleet

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with SimFleet(1) as fleet, Processes() as procs:
        yield AgentCacheGateways(procs, fleet.urls, args=["--extra-fields", "sim_whole_answer"]).urls[0]


def test_a_whole_call_is_sent_whole_and_the_workers_answer_passed_on(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", json=CHAT, headers={"x-session-id": "w1"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] in ("stop", "length") and answer["usage"]["prompt_tokens"] > 0
    assert answer["metadata"] == {"weight_version": "default"}  # only SGLang's whole answer has it
    r = httpx.post(gateway + "/v1/completions", json={"model": "m", "prompt": "once upon", "max_tokens": 4},
                   headers={"x-session-id": "w1c"})
    assert r.status_code == 200 and r.json()["object"] == "text_completion", r.text


def test_a_streamed_call_answered_whole_is_the_requests_fault(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", json={**CHAT, "sim_whole_answer": True, "stream": True},
                   headers={"x-session-id": "w3"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "worker_response_mismatch", r.text


def test_a_whole_answer_past_its_deadline_is_waited_for_while_the_worker_answers_its_health() -> None:
    floor = 1.5  # /health asked 0.75 s before each deadline (the simulated worker answers in 0.5 s)
    with Processes() as procs:
        workers = SimWorkers(procs, 2, time_scale=0.5, capacity_tokens=100_000)
        gw = AgentCacheGateways(procs, workers.urls, args=["--first-byte-floor", str(floor),
                                                           "--extra-fields", "sim_output"]).urls[0]
        headers = {"x-session-id": "long-1"}
        body = {**CHAT, "sim_output": "word " * 1500}  # the same size each time: only the answer's length differs
        with httpx.Client(base_url=gw, timeout=60) as client:
            home = {client.post("/v1/chat/completions", json={**body, "max_tokens": 1},
                                headers=headers).headers["x-agent-cache-worker"] for _ in range(10)}
            assert len(home) == 1  # a record of short whole answers: the deadline is the floor
            started = time.monotonic()
            r = client.post("/v1/chat/completions", json={**body, "max_tokens": 1500}, headers=headers)
            took = time.monotonic() - started
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 1500 and took > 2 * floor, took
            assert r.headers["x-agent-cache-worker"] in home  # not given up on and sent elsewhere
            metrics = client.get("/metrics").text
        workers.close()
    failovers = [line for line in metrics.splitlines()
                 if line.startswith("agent_cache_failovers_total") and not line.endswith(" 0.0")]
    assert failovers == [], failovers
