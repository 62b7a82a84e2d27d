"""``ChatSGLang`` without a thread id: conversations opening alike do not hot-spot one worker, and each
sticks to its worker once it diverges."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from agent_cache.langchain import ChatSGLang
from agent_cache.sim import SimFleet

SYSTEM = "You are a helpful assistant for a chat front-end. Answer briefly and politely. " * 8
CONVERSATIONS, STEPS = 200, 3


@pytest.fixture
def fleet4() -> Iterator[SimFleet]:
    with SimFleet(4, time_scale=0.0) as f:
        yield f


@pytest.mark.slow
def test_conversations_sharing_their_start_spread_and_stick(fleet4):
    model = ChatSGLang(model="sim", workers=fleet4.urls, max_tokens=8)
    convs: dict[int, list[BaseMessage]] = {i: [SystemMessage(SYSTEM), HumanMessage("Hello")]
                                           for i in range(CONVERSATIONS)}
    workers: dict[int, list[str]] = {i: [] for i in convs}

    def step(i: int, k: int) -> None:
        out = model.invoke(convs[i])
        assert out.response_metadata["session_id"].startswith("conv-")
        workers[i].append(out.response_metadata["worker"])
        convs[i] += [AIMessage(out.content), HumanMessage(f"Question {k} of conversation {i}.")]

    try:
        for k in range(STEPS):  # the conversations advance together, as users of a chat front-end do
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: step(i, k), convs))
    finally:
        model.close()
    counts = Counter(w for ws in workers.values() for w in ws)
    busiest = max(counts.values()) / sum(counts.values())
    stuck = sum(len(set(ws[1:])) == 1 for ws in workers.values()) / len(workers)
    print(f"busiest worker {busiest:.1%} of calls; steps 2-3 on one worker: {stuck:.1%}")
    assert busiest <= 0.40, counts
    assert stuck >= 0.95, stuck
