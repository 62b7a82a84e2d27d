"""A worker that hangs (SIGSTOP) mid-run: steps go on elsewhere after the stall deadline, none fails.

Two simulated worker processes; the one serving the session is frozen
between steps. Nothing is mocked: the frozen process keeps its socket open
and accepts connections, as a hung GPU worker does.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.processes import Processes
from agent_cache.server_processes import SimWorkers

STALL = 1.0
SYSTEM = "You are a careful agent. " * 20


def _frozen(workers: SimWorkers, url: str):
    return workers._procs[workers.urls.index(url)].popen  # noqa: SLF001 - the test owns these processes


@pytest.mark.slow
def test_steps_survive_a_hung_worker_within_the_stall_deadline_plus_a_retry() -> None:
    with Processes() as procs:
        workers = SimWorkers(procs, 2, time_scale=0.0, capacity_tokens=100_000)
        model = ChatSGLang(model="sim", workers=workers.urls, stall_timeout=STALL, max_tokens=8,
                           health_probe_interval=None)
        history = [SystemMessage(SYSTEM), HumanMessage("step 0")]
        first = model.invoke(history, session_id="agent-1")
        hung = _frozen(workers, first.response_metadata["worker"])
        hung.send_signal(signal.SIGSTOP)
        try:
            durations, served = [], []
            for k in range(1, 4):
                history += [first, HumanMessage(f"step {k}")]
                t0 = time.perf_counter()
                msg = model.invoke(history, session_id="agent-1")
                durations.append(time.perf_counter() - t0)
                served.append(msg.response_metadata["worker"])
            assert all(w != first.response_metadata["worker"] for w in served)  # 0 failed steps, all elsewhere
            # the first step after the freeze waits out the stall deadline once, plus the retry
            assert durations[0] < STALL + 0.2 + 3.0, durations
            assert max(durations[1:]) < STALL + 3.0, durations

            async def step() -> str:
                msg = await model.ainvoke(history + [HumanMessage("async step")], session_id="agent-1")
                return msg.response_metadata["worker"]

            assert asyncio.run(step()) != first.response_metadata["worker"]
        finally:
            hung.send_signal(signal.SIGCONT)
            model.close()
            workers.close()


@pytest.mark.slow
def test_a_hung_worker_is_left_after_its_adaptive_first_byte_deadline() -> None:
    """With the default 30 s stall_timeout, a worker with a record of fast first tokens is given up
    on after the first-byte floor (1 s here), not after 30 s."""
    from agent_cache.routing import Router

    with Processes() as procs:
        workers = SimWorkers(procs, 2, time_scale=0.0, capacity_tokens=100_000)
        router = Router(workers.urls, probe_interval=None, first_byte_floor=1.0)
        model = ChatSGLang(model="sim", router=router, max_tokens=8)
        assert model.stall_timeout == 30.0
        history = [SystemMessage(SYSTEM), HumanMessage("step 0")]
        first = model.invoke(history, session_id="agent-2")
        home = first.response_metadata["worker"]
        for k in range(10):  # a record of times to first token on the session's worker
            assert model.invoke(history + [HumanMessage(f"warm {k}")], session_id="agent-2") \
                .response_metadata["worker"] == home
        assert router.first_byte.deadline(home, 30.0) == 1.0  # 3 x its p95 is far under the floor
        hung = _frozen(workers, home)
        hung.send_signal(signal.SIGSTOP)
        try:
            t0 = time.perf_counter()
            msg = model.invoke(history + [HumanMessage("after the freeze")], session_id="agent-2")
            took = time.perf_counter() - t0
            assert msg.response_metadata["worker"] != home
            assert took < 1.0 + 0.2 + 3.0, took  # the floor, the backoff, the retry: not 30 s
        finally:
            hung.send_signal(signal.SIGCONT)
            model.close()
            router.close()
            workers.close()
