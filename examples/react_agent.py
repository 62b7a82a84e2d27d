# %% [markdown]
# # A ReAct agent that keeps hitting the prefix cache
#
# A LangChain ReAct agent (`create_agent`) with two tools, a calculator and a
# search over a few documents, talks to a fleet of two workers through
# `ChatSGLang`. `SessionMiddleware` turns the LangGraph thread id into the
# session id, so every step of the conversation goes to the same worker and
# the growing prompt is served from that worker's radix prefix cache.
#
# **The workers here are simulated** (`agent_cache.sim.SimFleet`: a real
# radix cache over tokens, deterministic made-up answers; not SGLang, no GPU
# needed). To run against real SGLang workers, drop the fleet and pass their
# URLs: `ChatSGLang(model="qwen", workers=["http://gpu-1:30000", "http://gpu-2:30000"])`
# (start SGLang with `--enable-cache-report` so it reports cached tokens).

# %%
import ast
import json
import operator

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from agent_cache import ChatSGLang, SessionMiddleware
from agent_cache.sim import SimFleet

# %% [markdown]
# ## Tools
#
# The calculator walks the expression's syntax tree instead of calling
# `eval`, so the model can only ask for arithmetic, never run code.

# %%
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers and + - * / ** are allowed")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '330 - 93'."""
    try:
        return str(_evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


DOCUMENTS = {
    "Eiffel Tower": "The Eiffel Tower in Paris is 330 metres tall and was completed in 1889.",
    "Statue of Liberty": "The Statue of Liberty in New York is 93 metres tall including its pedestal.",
    "Burj Khalifa": "The Burj Khalifa in Dubai is 828 metres tall and opened in 2010.",
}


@tool
def search(query: str) -> str:
    """Search a small set of documents about famous buildings."""
    words = set(query.lower().split())
    # the document sharing the most words with the query
    best = max(DOCUMENTS, key=lambda title: len(words & set(title.lower().split())))
    return f"{best}: {DOCUMENTS[best]}"


print(search.invoke({"query": "Eiffel Tower height"}))
print(calculator.invoke({"expression": "330 - 93"}))

# %% [markdown]
# ## The agent
#
# Two simulated workers stand in for a GPU fleet. The checkpointer keeps the
# conversation per thread, so a later turn continues the same session.

# %%
fleet = SimFleet(2, time_scale=0.0).start()
names = {url: f"worker-{i}" for i, url in enumerate(fleet.urls)}  # short labels for printing

llm = ChatSGLang(model="qwen", workers=fleet.urls)
agent = create_agent(
    llm,
    tools=[calculator, search],
    system_prompt="You are a careful assistant. Look facts up with search and do arithmetic with calculator.",
    middleware=[SessionMiddleware()],  # thread id -> session id -> one worker
    checkpointer=InMemorySaver(),
)

# %% [markdown]
# ## A multi-step task
#
# Three turns in one thread: look up two heights, then compute the
# difference. Every turn is a tool call plus a final answer, so six model
# calls, each one's prompt extending the previous one's.

# %%
config = {"configurable": {"thread_id": "heights-1"}}
turns = [
    "Use search to find 'Eiffel Tower height'.",
    "Now use search again for 'Statue of Liberty height'.",
    "Finally, use the calculator to compute '330 - 93'.",
]
for text in turns:
    state = agent.invoke({"messages": [{"role": "user", "content": text}]}, config)
    print("user:", text)
    print("agent:", state["messages"][-1].content[:80])

# %% [markdown]
# ## Where did each step run, and what came from the cache?

# %%
steps = [m for m in state["messages"] if isinstance(m, AIMessage)]
print(f"{'step':>4}  {'worker':8}  {'routing':18}  {'action':11}  {'input':>5}  {'cache_read':>10}")
for i, msg in enumerate(steps, 1):
    meta, usage = msg.response_metadata, msg.usage_metadata
    action = msg.tool_calls[0]["name"] if msg.tool_calls else "answer"
    print(f"{i:>4}  {names[meta['worker']]:8}  {meta['routing']:18}  {action:11}  "
          f"{usage['input_tokens']:>5}  {usage['input_token_details']['cache_read']:>10}")

# %%
import matplotlib

matplotlib.use("Agg")  # script only: draw off-screen (the notebook shows the plot inline)
import matplotlib.pyplot as plt

inputs = [m.usage_metadata["input_tokens"] for m in steps]
cached = [m.usage_metadata["input_token_details"]["cache_read"] for m in steps]
x = range(1, len(steps) + 1)
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar(x, inputs, color="lightgray", label="prompt tokens")
ax.bar(x, cached, color="tab:green", label="served from cache")
ax.set_xlabel("agent step")
ax.set_ylabel("tokens")
ax.set_title("ReAct agent: cache hits per step")
ax.legend()
fig.tight_layout()
fig.savefig("react_agent_cache.png")

# %% [markdown]
# ## Summary
#
# One line of JSON that the project's tests check: the whole session stayed
# on one worker and each step read more from the cache than the one before.

# %%
summary = {
    "steps": len(steps),
    "workers": sorted({names[m.response_metadata["worker"]] for m in steps}),
    "routing": [m.response_metadata["routing"] for m in steps],
    "input_tokens": inputs,
    "cache_read": cached,
    "hit_rate": round(sum(cached) / sum(inputs), 3),
}
print("SUMMARY " + json.dumps(summary))
llm.close()
fleet.stop()
