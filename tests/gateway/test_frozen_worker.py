"""A worker frozen (SIGSTOP: its listening socket still accepts connections, nothing answers) under
concurrent agent sessions: every call, a new session's first included, leaves it within the first-byte
bound, and placement stops sending it new sessions once its probe fails, with no trial call until a
probe answers again."""

from __future__ import annotations

import signal
import threading
import time
from typing import Iterator

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways, SimWorkers

FLOOR = 5.0  # the default first-byte floor
BOUND = FLOOR + 0.2 + 3.0  # the floor, the backoff, the retry elsewhere
FREEZE = 20.0
AGENTS = 12
SYSTEM = "You are a careful agent. " * 20


@pytest.fixture
def workers() -> Iterator[SimWorkers]:
    with Processes() as procs:
        fleet = SimWorkers(procs, 3, time_scale=1.0, capacity_tokens=200_000)
        yield fleet
        fleet.close()


def _agents(gateway: str, stop: threading.Event, log: list[tuple[float, float, int, int, str]]) -> list[threading.Thread]:
    """Agents of 4 steps each, one session after another (half of them streamed): (start, seconds, step,
    status, worker) of each call."""
    lock = threading.Lock()

    def agent(a: int) -> None:
        with httpx.Client(base_url=gateway, timeout=120) as client:
            n = 0
            while not stop.is_set():
                session, n = f"agent-{a}-{n}", n + 1
                messages = [{"role": "system", "content": SYSTEM}]
                for step in range(4):
                    messages.append({"role": "user", "content": f"step {step} of {session}"})
                    body = {"model": "m", "messages": messages, "max_tokens": 8, "stream": a % 2 == 0}
                    t0 = time.monotonic()
                    with client.stream("POST", "/v1/chat/completions", json=body,
                                       headers={"x-session-id": session}) as r:
                        r.read()
                    with lock:
                        log.append((t0, time.monotonic() - t0, step, r.status_code,
                                    r.headers.get("x-agent-cache-worker", "")))
                    messages.append({"role": "assistant", "content": "ok"})

    return [threading.Thread(target=agent, args=(a,), daemon=True) for a in range(AGENTS)]


@pytest.mark.slow
def test_no_call_waits_on_a_frozen_worker_past_the_first_byte_bound(procs: Processes, workers: SimWorkers) -> None:
    gateway = AgentCacheGateways(procs, workers.urls).urls[0]
    stop, log = threading.Event(), []
    agents = _agents(gateway, stop, log)
    for t in agents:
        t.start()
    frozen = workers._procs[0].popen  # noqa: SLF001 - the test owns the process
    try:
        time.sleep(6)  # a record of first bytes on every worker
        frozen.send_signal(signal.SIGSTOP)
        t_freeze = time.monotonic()
        try:
            time.sleep(FREEZE)
        finally:
            frozen.send_signal(signal.SIGCONT)
        t_thaw = time.monotonic()
    finally:
        stop.set()
        for t in agents:
            t.join(timeout=120)
    during = [e for e in log if t_freeze <= e[0] < t_thaw]
    assert len(during) > 50 and all(status == 200 for _, _, _, status, _ in during)
    slow = [(round(t0 - t_freeze, 1), round(took, 1), step) for t0, took, step, _, _ in during if took > BOUND]
    assert slow == []  # (seconds into the freeze, seconds taken, step) of each call past the bound
    # once its probe failed (5 s timeout, at most 5 s after the freeze began), no call was placed there
    late = [e for e in during if e[0] > t_freeze + 11 and e[4] == workers.urls[0]]
    assert late == []
