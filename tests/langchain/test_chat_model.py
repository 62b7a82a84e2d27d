"""ChatSGLang construction, usage metadata, errors and retries against simulated workers."""

from __future__ import annotations

import threading
import time

import pytest
from langchain_core.exceptions import ContextOverflowError, ModelConnectionError
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from agent_cache.errors import ConfigError, ContextLengthError, WorkerConnectionError
from agent_cache.langchain import ChatSGLang
from agent_cache.sim import SimFleet


def test_config_errors():
    with pytest.raises(ConfigError, match="base_url"):
        ChatSGLang(model="m")
    with pytest.raises(ConfigError, match="workers"):
        ChatSGLang(model="m", base_url="http://a:1", workers=["http://b:1"])
    with pytest.raises(ConfigError, match=r"workers\[1\]"):
        ChatSGLang(model="m", workers=["http://a:1", "ftp://b"])
    with pytest.raises(ConfigError, match="base_url"):
        ChatSGLang(model="m", base_url="not a url")


def test_usage_and_metadata(lc_fleet):
    model = ChatSGLang(model="sim", base_url=lc_fleet.urls[0] + "/v1/")
    prompt = [SystemMessage("Be brief. " * 30), HumanMessage("hello there")]
    first = model.invoke(prompt, session_id="meta")
    second = model.invoke(prompt, session_id="meta")
    for msg in (first, second):
        u = msg.usage_metadata
        assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] > 0
        meta = msg.response_metadata
        assert meta["worker"] == lc_fleet.urls[0] and meta["model_name"] == "sim"
        assert meta["finish_reason"] == "stop" and meta["template_id"].startswith("t_")
        assert meta["routing"] in ("placed_least_load", "pinned")
        assert meta["cached_tokens"] == u["input_token_details"]["cache_read"]
    assert second.usage_metadata["input_token_details"]["cache_read"] > 0
    assert first.response_metadata["template_id"] == second.response_metadata["template_id"]
    assert [first.response_metadata["routing"], second.response_metadata["routing"]] == ["placed_least_load", "pinned"]


def test_stream_usage_once_on_last_chunk(lc_fleet):
    model = ChatSGLang(model="sim", workers=lc_fleet.urls)
    chunks = list(model.stream("tell me something"))
    with_usage = [c for c in chunks if c.usage_metadata]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1]
    assert not [c for c in ChatSGLang(model="sim", workers=lc_fleet.urls, stream_usage=False).stream("x") if c.usage_metadata]


def test_tool_round_trip_and_invalid_arguments(lc_fleet):
    def search(query: str) -> str:
        """Search the web."""
        return query

    model = ChatSGLang(model="sim", workers=lc_fleet.urls).bind_tools([search], tool_choice="search")
    msg = model.invoke("search for 'cats'")
    assert msg.tool_calls[0]["name"] == "search" and msg.tool_calls[0]["args"] == {"query": "cats"}
    # history with a tool call and its result converts and is accepted
    bare = ChatSGLang(model="sim", workers=lc_fleet.urls)
    bad = AIMessage("", tool_calls=[], invalid_tool_calls=[{"type": "invalid_tool_call", "id": "c1", "name": "search", "args": "{bad", "error": None}])
    reply = bare.invoke([HumanMessage("q"), msg, ToolMessage("found", tool_call_id=msg.tool_calls[0]["id"]), bad, HumanMessage("ok")])
    assert isinstance(reply.content, str)


def test_dead_worker_raises_connection_error_after_retries():
    with SimFleet(1, time_scale=0.0) as fleet:
        url = fleet.urls[0]
        fleet.stop_worker(0)
        model = ChatSGLang(model="sim", base_url=url, max_retries=1)
        start = time.monotonic()
        with pytest.raises(WorkerConnectionError) as info:
            model.invoke("hi")
        assert isinstance(info.value, ModelConnectionError) and info.value.url == url
        assert time.monotonic() - start >= 0.1  # one backoff: RETRY_BACKOFF (0.2 s) with equal jitter, at least half
        with pytest.raises(ModelConnectionError):
            list(model.stream("hi"))


async def test_retry_recovers_when_worker_returns():
    with SimFleet(1, time_scale=0.0) as fleet:
        fleet.stop_worker(0)
        threading.Timer(0.1, fleet.start_worker, args=(0,)).start()
        model = ChatSGLang(model="sim", base_url=fleet.urls[0], max_retries=3)
        msg = await model.ainvoke("hi")
        assert msg.content


def test_context_overflow_is_not_retried():
    with SimFleet(1, time_scale=0.0, max_total_tokens=64) as fleet:
        model = ChatSGLang(model="sim", base_url=fleet.urls[0], max_retries=3)
        start = time.monotonic()
        with pytest.raises(ContextOverflowError) as info:
            model.invoke("word " * 500)
        assert isinstance(info.value, ContextLengthError) and not info.value.retryable
        # three retries would wait at least 0.1 + 0.2 + 0.4 s of backoff (RETRY_BACKOFF, halved by jitter at most)
        assert time.monotonic() - start < 0.7


def test_session_id_never_sent_and_extra_body_passes(lc_fleet):
    # an unknown body field would be refused by the client, so session_id must be stripped
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, extra_body={"sim_output": "scripted"})
    assert model.invoke("x", session_id="s").content == "scripted"


async def test_close_releases_clients(lc_fleet):
    model = ChatSGLang(model="sim", workers=lc_fleet.urls)
    await model.ainvoke("hello", session_id="closing")
    model.invoke("hello", session_id="closing")
    assert model._transport is not None and model._atransports
    await model.aclose()
    assert model._transport is None and not model._atransports


def test_per_call_template_variables_reach_the_templater(lc_fleet):
    from langchain_core.messages import HumanMessage, SystemMessage

    model = ChatSGLang(model="sim", workers=lc_fleet.urls, templates="templatize", max_tokens=4)
    ids = set()
    for user in ("Alice Example", "Bob Sample"):
        prompt = [SystemMessage(f"You are helping {user}. Be brief. " * 3), HumanMessage("hi")]
        msg = model.invoke(prompt, session_id=f"tv-{user}", template_variables={"user_name": user})
        ids.add(msg.response_metadata["template_id"])
    assert len(ids) == 1  # the user name moved out of the template
    bound = model.bind(template_variables={"user_name": "Carol Third"})
    msg = bound.invoke([SystemMessage("You are helping Carol Third. Be brief. " * 3), HumanMessage("hi")], session_id="tv-c")
    assert msg.response_metadata["template_id"] in ids
