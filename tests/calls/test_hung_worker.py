"""The same hung-worker fault through both doors, whole and streamed: the session's worker is frozen
(SIGSTOP: its socket stays open and accepts connections, as a hung GPU worker's does) after a record
of fast first bytes, and the next step is served elsewhere within seconds (the first-byte floor, the
backoff, the retry), not after the 60 s --timeout or the 30 s stall_timeout."""

from __future__ import annotations

import signal
import time
from typing import Callable, Iterator

import httpx
import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways, SimWorkers
from agent_cache.routing import Router

FLOOR = 1.0
BOUND = FLOOR + 0.2 + 3.0  # the floor (a whole call: its deadline, /health asked before it), the backoff, the retry
SYSTEM = "You are a careful agent. " * 20
Step = Callable[[str], str]  # a step's text -> the worker that served it


@pytest.fixture
def workers() -> Iterator[SimWorkers]:
    with Processes() as procs:
        fleet = SimWorkers(procs, 2, time_scale=0.0, capacity_tokens=100_000)
        yield fleet
        fleet.close()


def _gateway_step(url: str, stream: bool) -> Step:
    def step(text: str) -> str:
        body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                "max_tokens": 8, "stream": stream}
        headers = {"x-session-id": "hang-1"}
        if stream:
            with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
                assert r.status_code == 200 and "data: [DONE]" in "".join(r.iter_lines())
        else:
            r = httpx.post(url, json=body, headers=headers, timeout=60)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        return r.headers["x-agent-cache-worker"]

    return step


def _model_step(model: ChatSGLang, stream: bool) -> Step:
    def step(text: str) -> str:
        messages = [SystemMessage(SYSTEM), HumanMessage(text)]
        if stream:
            chunks = list(model.stream(messages, session_id="hang-1"))
            assert "".join(str(c.content) for c in chunks)
            return str(chunks[-1].response_metadata["worker"])
        return str(model.invoke(messages, session_id="hang-1").response_metadata["worker"])

    return step


def _hung_step_is_bounded(workers: SimWorkers, step: Step) -> None:
    home = {step(f"warm {k}") for k in range(10)}  # a record of first-byte times on the session's worker
    assert len(home) == 1
    hung = workers._procs[workers.urls.index(next(iter(home)))].popen  # noqa: SLF001 - the test owns it
    hung.send_signal(signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        worker = step("after the freeze")
        took = time.perf_counter() - t0
        assert worker not in home and took < BOUND, took
    finally:
        hung.send_signal(signal.SIGCONT)


@pytest.mark.parametrize(("transport", "stream"), [("httpx", False), ("httpx", True), ("fast", False)])
@pytest.mark.slow
def test_through_the_gateway(workers: SimWorkers, transport: str, stream: bool) -> None:
    with Processes() as procs:
        gw = AgentCacheGateways(procs, workers.urls, args=["--first-byte-floor", str(FLOOR),
                                                           "--transport", transport])
        _hung_step_is_bounded(workers, _gateway_step(gw.urls[0] + "/v1/chat/completions", stream))


@pytest.mark.parametrize("stream", [False, True])
def test_through_chat_sglang(workers: SimWorkers, stream: bool) -> None:
    router = Router(workers.urls, probe_interval=None, first_byte_floor=FLOOR)
    model = ChatSGLang(model="sim", router=router, max_tokens=8)
    try:
        _hung_step_is_bounded(workers, _model_step(model, stream))
    finally:
        model.close()
        router.close()
