"""A ReAct agent (create_agent) with two local tools over two simulated workers."""

from __future__ import annotations

import ast
import asyncio
import operator

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from agent_cache.langchain import ChatSGLang, SessionMiddleware
from agent_cache.sim import SimFleet

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
_ITEMS = {1: "apples cost 3 euros", 2: "pears cost 4 euros", 3: "plums cost 5 euros"}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression: {ast.dump(node)}")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '2 * (3 + 4)'."""
    return str(_eval(ast.parse(expression, mode="eval").body))


@tool
def lookup(item_id: int) -> str:
    """Look up a fact about an item by its numeric id."""
    return _ITEMS.get(item_id, "unknown item")


def test_calculator_is_safe():
    assert calculator.invoke({"expression": "2 * (3 + 4)"}) == "14"
    with pytest.raises(ValueError):
        calculator.invoke({"expression": "__import__('os')"})


@pytest.fixture
def agent_fleet():
    with SimFleet(2, time_scale=0.0) as fleet:
        yield fleet


def _agent(fleet: SimFleet):
    model = ChatSGLang(model="sim", workers=fleet.urls)
    return create_agent(
        model,
        tools=[calculator, lookup],
        system_prompt="You are a shopping assistant. Use the tools to answer. " * 10,
        middleware=[SessionMiddleware()],
        checkpointer=InMemorySaver(),
    )


def _check_thread(messages, thread: str, item: int, expression: str) -> None:
    ais = [m for m in messages if isinstance(m, AIMessage)]
    assert len(ais) == 3  # lookup, calculator, final answer
    assert [c["name"] for m in ais[:2] for c in m.tool_calls] == ["lookup", "calculator"]
    assert ais[0].tool_calls[0]["args"] == {"item_id": item}
    assert ais[1].tool_calls[0]["args"] == {"expression": expression}
    tools = [m for m in messages if isinstance(m, ToolMessage)]
    assert tools[0].content == _ITEMS[item]
    assert tools[1].content == str(_eval(ast.parse(expression, mode="eval").body))
    assert ais[2].content and not ais[2].tool_calls
    assert {m.response_metadata["session_id"] for m in ais} == {thread}
    assert len({m.response_metadata["worker"] for m in ais}) == 1  # sticky
    reads = [m.usage_metadata["input_token_details"]["cache_read"] for m in ais]
    assert reads[0] < reads[1] < reads[2], reads


def _task(item: int, expression: str) -> dict:
    text = f"First use lookup for item {item}, then use the calculator on '{expression}'."
    return {"messages": [("user", text)]}


def test_react_agent_sticky_and_cached(agent_fleet):
    agent = _agent(agent_fleet)
    out = agent.invoke(_task(2, "4 * 12"), {"configurable": {"thread_id": "shopper-1"}})
    _check_thread(out["messages"], "shopper-1", 2, "4 * 12")


async def test_two_threads_concurrently(agent_fleet):
    agent = _agent(agent_fleet)
    jobs = {"alpha": (1, "3 * 7"), "beta": (3, "5 + 5 * 2")}
    outs = await asyncio.gather(
        *(agent.ainvoke(_task(*job), {"configurable": {"thread_id": t}}) for t, job in jobs.items())
    )
    for (thread, job), out in zip(jobs.items(), outs):
        _check_thread(out["messages"], thread, *job)


def test_an_agent_without_a_thread_id_sticks_to_one_worker(agent_fleet):
    """No checkpointer, no thread id, no middleware: the session is inferred from the conversation."""
    model = ChatSGLang(model="sim", workers=agent_fleet.urls)
    agent = create_agent(model, tools=[calculator, lookup],
                         system_prompt="You are a shopping assistant. Use the tools to answer. " * 10)
    for item, expression in ((1, "2 * 8"), (3, "9 - 4")):
        out = agent.invoke(_task(item, expression))
        ais = [m for m in out["messages"] if isinstance(m, AIMessage)]
        sessions = [m.response_metadata["session_id"] for m in ais]
        # step 1 is placed as a new session (beside its template); from step 2 on, one session
        assert len(ais) == 3 and len(set(sessions[1:])) == 1 and all(s.startswith("conv-") for s in sessions)
        assert len({m.response_metadata["worker"] for m in ais}) == 1  # every step on one worker
        reads = [m.usage_metadata["input_token_details"]["cache_read"] for m in ais]
        assert reads[0] < reads[1] < reads[2], reads
