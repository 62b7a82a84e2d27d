# %% [markdown]
# # Any framework: an OpenAI SDK agent through `agent-cache serve`
#
# `agent-cache serve` is an OpenAI-compatible gateway in front of the
# workers. An agent written with the plain OpenAI SDK (no LangChain) gets the
# same routing as `ChatSGLang(workers=[...])`: each session pinned to one worker, its
# growing prompt served from that worker's prefix cache, and the system
# prompt's volatile values (a date, a request id) moved out of the shared
# prefix, so different sessions share it too.
#
# **The workers here are simulated** (`agent_cache.sim.SimFleet`: a real
# radix cache over tokens, deterministic made-up answers; not SGLang, no GPU
# needed). Against real SGLang workers, start the gateway with their URLs:
# `agent-cache serve --workers http://gpu-1:30000,http://gpu-2:30000 --redis redis://...`
# (SGLang started with `--enable-cache-report` reports cached tokens).

# %%
import ast
import json
import operator
import subprocess
import sys
import time
import uuid

import httpx
from openai import OpenAI

from agent_cache.sim import SimFleet

fleet = SimFleet(2, time_scale=0.0).start()
names = {url: f"worker-{i}" for i, url in enumerate(fleet.urls)}  # short labels for printing

# the gateway, as you would start it from a shell (here with the in-process store: one replica)
port = 8400 + uuid.uuid4().int % 500
gateway = subprocess.Popen([sys.executable, "-m", "agent_cache.cli", "serve", "--workers", ",".join(fleet.urls),
                            "--port", str(port)])
for _ in range(300):  # ready once /health answers
    try:
        if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
            break
    except httpx.HTTPError:
        time.sleep(0.1)

client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")

# %% [markdown]
# ## Tools and the agent loop
#
# A price list and a calculator, and the usual tool-calling loop: call the
# model, run the tools it asks for, send the results back, until it answers.
# `x-session-id` names the session; without it the gateway infers one from
# the conversation's start, which every step of a run repeats.

# %%
PRICES = {1: 3.0, 2: 4.5, 3: 12.0}


def lookup(item_id: int) -> str:
    return f"item {item_id} costs {PRICES.get(item_id, 0.0)} euros"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("only numbers and + - * / are allowed")


def calculator(expression: str) -> str:
    """Arithmetic only: the expression's syntax tree is walked, never run as code."""
    try:
        return str(_evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "The price of an item.",
                                      "parameters": {"type": "object", "properties": {"item_id": {"type": "integer"}},
                                                     "required": ["item_id"]}}},
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic like '3 * 4'.",
                                      "parameters": {"type": "object",
                                                     "properties": {"expression": {"type": "string"}},
                                                     "required": ["expression"]}}},
]
RUN = {"lookup": lambda a: lookup(int(a["item_id"])), "calculator": lambda a: calculator(str(a["expression"]))}


def run_agent(session: str, task: str, request_id: str) -> list[dict]:
    system = (f"You are a shop assistant. Request {request_id}, received 2026-12-03 14:07:31 UTC. "
              + "Use the tools to look prices up and to compute totals; answer briefly. " * 8)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    steps = []
    while True:
        raw = client.chat.completions.with_raw_response.create(
            model="default", messages=messages, tools=TOOLS, max_tokens=64, extra_headers={"x-session-id": session})
        reply = raw.parse()
        message = reply.choices[0].message
        steps.append({"worker": names[raw.headers["x-agent-cache-worker"]],
                      "input": reply.usage.prompt_tokens,
                      "cache_read": reply.usage.prompt_tokens_details.cached_tokens or 0,
                      "action": message.tool_calls[0].function.name if message.tool_calls else "answer"})
        if not message.tool_calls:
            return steps
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = RUN[call.function.name](json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

# %% [markdown]
# ## Two sessions of the same agent
#
# Each is a lookup, a calculation and an answer. Their system prompts differ
# only in the request id, which the gateway's templates move after the
# stable part: the second session's first call already reads the shared
# prompt from the cache (if it lands on the first one's worker).

# %%
runs = {}
for n, item in ((1, 1), (2, 3)):
    session = f"order-{n}"
    task = f"First use lookup for item {item}, then use the calculator on '{PRICES[item]} * 4'."
    runs[session] = run_agent(session, task, request_id=uuid.uuid4().hex[:12])
    print(f"{session}:")
    for i, step in enumerate(runs[session], 1):
        print(f"  step {i}  {step['worker']:8}  {step['action']:10}  input {step['input']:>4}  "
              f"cache_read {step['cache_read']:>4}")

# %% [markdown]
# ## Summary
#
# One line of JSON that the project's tests check: each session stayed on
# one worker and each of its steps read more from the cache than the one
# before.

# %%
summary = {
    session: {"workers": sorted({s["worker"] for s in steps}), "actions": [s["action"] for s in steps],
              "cache_read": [s["cache_read"] for s in steps], "input": [s["input"] for s in steps]}
    for session, steps in runs.items()
}
print("SUMMARY " + json.dumps(summary))
gateway.terminate()
gateway.wait(30)
fleet.stop()
