"""Usage (with ``cache_read``), finish reason and worker on every surface a LangChain app reads a call from."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessageChunk, BaseMessage

from agent_cache.langchain import ChatSGLang

SYSTEM = "You are a terse assistant. Answer in a few words. " * 6


def _check(message: BaseMessage, workers: list[str]) -> None:
    usage = getattr(message, "usage_metadata", None)
    assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0, message
    assert usage["input_token_details"]["cache_read"] >= 0
    assert message.response_metadata["worker"] in workers
    assert message.response_metadata["finish_reason"] in ("stop", "length")


def _merged(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    assert len({c.id for c in chunks}) == 1, [c.id for c in chunks]  # one message: one id on every chunk
    out = chunks[0]
    for c in chunks[1:]:
        out = out + c
    return out


@pytest.fixture
def model(lc_fleet):
    m = ChatSGLang(model="sim", workers=lc_fleet.urls, max_tokens=4)
    yield m
    m.close()


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_langgraph_messages_mode_carries_usage_and_worker(lc_fleet, streaming):
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, max_tokens=4, streaming=streaming)
    agent = create_agent(model, tools=[], system_prompt=SYSTEM)
    try:
        for _ in range(2):
            chunks = [c for c, _meta in agent.stream({"messages": [("user", "hi")]}, stream_mode="messages")
                      if isinstance(c, AIMessageChunk)]
            last = chunks[-1]
            assert last.usage_metadata is not None and last.response_metadata["worker"] in lc_fleet.urls
            _check(_merged(chunks), lc_fleet.urls)
        assert last.usage_metadata["input_token_details"]["cache_read"] > 0  # the second run read the cache
    finally:
        model.close()


def test_langgraph_updates_mode_and_invoke(model, lc_fleet):
    agent = create_agent(model, tools=[], system_prompt=SYSTEM)
    updates = [m for u in agent.stream({"messages": [("user", "hi")]}, stream_mode="updates")
               for v in u.values() for m in v["messages"]]
    _check(updates[-1], lc_fleet.urls)
    _check(model.invoke("hi"), lc_fleet.urls)
    _check(_merged(list(model.stream("hi"))), lc_fleet.urls)


async def test_async_surfaces(model, lc_fleet):
    _check(await model.ainvoke("hi"), lc_fleet.urls)
    _check(_merged([c async for c in model.astream("hi")]), lc_fleet.urls)
    events: list[dict[str, Any]] = [e async for e in model.astream_events("hi", version="v2")]
    streamed = [e["data"]["chunk"] for e in events if e["event"] == "on_chat_model_stream"]
    _check(_merged(streamed), lc_fleet.urls)
    _check(next(e for e in events if e["event"] == "on_chat_model_end")["data"]["output"], lc_fleet.urls)
    agent = create_agent(model, tools=[], system_prompt=SYSTEM)
    chunks = [c async for c, _m in agent.astream({"messages": [("user", "hi")]}, stream_mode="messages")]
    _check(_merged(chunks), lc_fleet.urls)
