"""A whole call through the gateway: assembled from the worker's stream, or the worker's own whole answer
where an option of the request made it answer the stream whole; a streamed call answered whole is the
request's fault (400)."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with SimFleet(1) as fleet, Processes() as procs:
        yield AgentCacheGateways(procs, fleet.urls, args=["--extra-fields", "sim_whole_answer"]).urls[0]


def test_a_whole_answer_is_assembled_from_the_stream_as_the_worker_would_answer_it(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", json=CHAT, headers={"x-session-id": "w1"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] in ("stop", "length") and answer["usage"]["prompt_tokens"] > 0


def test_a_worker_answering_the_stream_whole_has_answered_a_whole_call_but_not_a_streamed_one(gateway: str) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", json={**CHAT, "sim_whole_answer": True},
                   headers={"x-session-id": "w2"})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"weight_version": "default"}  # the worker's own whole body, passed on
    r = httpx.post(gateway + "/v1/chat/completions", json={**CHAT, "sim_whole_answer": True, "stream": True},
                   headers={"x-session-id": "w3"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "worker_response_mismatch", r.text
