"""Session resolution: explicit, agent middleware, run metadata/config, fresh."""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver

from agent_cache.langchain import ChatSGLang, SessionMiddleware


@pytest.fixture(params=["invoke", "stream"])
def mode(request) -> str:
    return request.param


def _model(fleet, mode: str) -> ChatSGLang:
    return ChatSGLang(model="sim", workers=fleet.urls, streaming=mode == "stream")


def _call(model, mode: str, config=None, **kw) -> AIMessage:
    if mode == "invoke":
        return model.invoke("hello", config=config, **kw)
    full = None
    for chunk in model.stream("hello", config=config, **kw):
        full = chunk if full is None else full + chunk
    return full


async def _acall(model, mode: str, config=None, **kw) -> AIMessage:
    if mode == "invoke":
        return await model.ainvoke("hello", config=config, **kw)
    full = None
    async for chunk in model.astream("hello", config=config, **kw):
        full = chunk if full is None else full + chunk
    return full


def _sid(message: AIMessage) -> str:
    return message.response_metadata["session_id"]


def test_explicit(lc_fleet, mode):
    model = _model(lc_fleet, mode)
    assert _sid(_call(model.bind(session_id="bound"), mode)) == "bound"
    assert _sid(_call(model, mode, session_id="kwarg")) == "kwarg"
    # explicit beats the config
    assert _sid(_call(model, mode, {"configurable": {"thread_id": "t"}}, session_id="kwarg")) == "kwarg"


async def test_explicit_async(lc_fleet, mode):
    model = _model(lc_fleet, mode)
    assert _sid(await _acall(model.bind(session_id="bound"), mode)) == "bound"
    assert _sid(await _acall(model, mode, session_id="kwarg")) == "kwarg"


def test_metadata_and_config(lc_fleet, mode):
    model = _model(lc_fleet, mode)
    assert _sid(_call(model, mode, {"metadata": {"thread_id": "meta"}})) == "meta"
    assert _sid(_call(model, mode, {"configurable": {"thread_id": "thr"}})) == "thr"
    assert _sid(_call(model, mode, {"configurable": {"session_id": "ses", "thread_id": "thr"}})) == "ses"
    # ambient config of an enclosing runnable
    chain = RunnableLambda(lambda _: _call(model, mode))
    assert _sid(chain.invoke(None, {"configurable": {"thread_id": "outer"}})) == "outer"


async def test_metadata_and_config_async(lc_fleet, mode):
    model = _model(lc_fleet, mode)
    assert _sid(await _acall(model, mode, {"metadata": {"thread_id": "meta"}})) == "meta"
    assert _sid(await _acall(model, mode, {"configurable": {"thread_id": "thr"}})) == "thr"

    async def inner(_):
        return await _acall(model, mode)

    assert _sid(await RunnableLambda(inner).ainvoke(None, {"configurable": {"session_id": "outer"}})) == "outer"


def test_without_an_id_a_diverged_conversation_is_the_session(lc_fleet, mode):
    model = _model(lc_fleet, mode)
    a, b = _sid(_call(model, mode)), _sid(_call(model, mode))
    # step 1: the start names a shared prefix, not a session: each call is placed as a new session
    assert a.startswith("conv-") and b.startswith("conv-") and a != b and a.split("-")[1] == b.split("-")[1]
    start = [("system", "You are terse."), ("user", "hello"), ("ai", "hi"), ("user", "more")]
    step2 = model.invoke(start)
    step3 = model.invoke([*start, ("ai", "more of it"), ("user", "and more")])
    assert _sid(step2).startswith("conv-") and _sid(step2) == _sid(step3)  # diverged: one session from here
    assert step2.response_metadata["worker"] == step3.response_metadata["worker"]
    other = model.invoke([*start[:3], ("user", "less")])
    assert _sid(other) != _sid(step2)  # another conversation from the same start


def test_fresh_session_per_call_when_not_inferred(lc_fleet, mode):
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, streaming=mode == "stream", infer_sessions=False)
    a, b = _sid(_call(model, mode)), _sid(_call(model, mode))
    assert a.startswith("anon-") and b.startswith("anon-") and a != b


async def test_without_an_id_async(lc_fleet, mode):
    model = _model(lc_fleet, mode)
    a, b = _sid(await _acall(model, mode)), _sid(await _acall(model, mode))
    assert a.startswith("conv-") and a != b


def _agent(fleet, mode):
    return create_agent(_model(fleet, mode), tools=[], middleware=[SessionMiddleware()], checkpointer=InMemorySaver())


def test_agent_middleware(lc_fleet, mode):
    agent = _agent(lc_fleet, mode)
    out = agent.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "agent-thread"}})
    assert _sid(out["messages"][-1]) == "agent-thread"


async def test_agent_middleware_async(lc_fleet, mode):
    agent = _agent(lc_fleet, mode)
    out = await agent.ainvoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "agent-athread"}})
    assert _sid(out["messages"][-1]) == "agent-athread"


def test_middleware_sets_model_settings(lc_fleet):
    seen = {}

    class Spy(SessionMiddleware):
        def wrap_model_call(self, request, handler):
            def record(req):
                seen.update(req.model_settings)
                return handler(req)

            return super().wrap_model_call(request, record)

    agent = create_agent(_model(lc_fleet, "invoke"), tools=[], middleware=[Spy()], checkpointer=InMemorySaver())
    agent.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "spy"}})
    assert seen == {"session_id": "spy"}
