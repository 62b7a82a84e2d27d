"""Templates benchmark: normalise latency, and prefix sharing per mode.

Run: ``python -m agent_cache.bench.templates_bench``. Every number printed
comes from this run on this machine.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from typing import Any

from agent_cache.templates import TemplateMode, Templater
from agent_cache.templates.explain import render_chat
from agent_cache.percentile import percentile
from agent_cache.templates.templater import encoder

_WORDS = ("agent tool search answer question context document retrieve reason step observe "
          "plan verify source cite user policy format output result error retry").split()


def _tools(n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append({"type": "function", "function": {
            "name": f"tool_{i}", "description": " ".join(rng.choice(_WORDS) for _ in range(20)),
            "parameters": {"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string", "description": "what to look up"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "mode": {"type": "string", "enum": ["fast", "exact"]}}}}})
    return out


def _shuffle(obj: Any, rng: random.Random) -> Any:
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffle(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [_shuffle(v, rng) for v in obj]
    return obj


def _body(tokens: int, rng: random.Random) -> str:
    lines, n = [], 0
    while n < tokens:
        line = " ".join(rng.choice(_WORDS) for _ in range(12)) + "."
        lines.append(line)
        n += len(encoder().encode(line)) + 1
    return "\n".join(lines)


def _session(i: int, body: str, tools: list[dict[str, Any]],
             rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    ts = time.strftime("%Y-%m-%d %H:%M", time.gmtime(1_764_684_000 + 37 * i))
    name = rng.choice(["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah"]) + f" {rng.choice('KLMNOP')}."
    msgs = [{"role": "system", "content": f"Current time: {ts} UTC\nYou are helping {name}\n"
             f"Request id: {uuid.UUID(int=rng.getrandbits(128))}\n\n{body}"},
            {"role": "user", "content": f"Question {i}: what is the capital of country {i}?"}]
    rng.shuffle(tools_copy := [_shuffle(t, rng) for t in tools])
    return msgs, tools_copy, name


def _sessions(n: int, seed: int, body_tokens: int, tool_count: int) -> list[Any]:
    """``n`` sessions of one agent: a system prompt of about ``body_tokens`` tokens and ``tool_count`` tools."""
    rng = random.Random(seed)
    body, tools = _body(body_tokens, rng), _tools(tool_count, rng)
    return [_session(i, body, tools, rng) for i in range(n)]


def latency(n: int = 300) -> None:
    sessions = _sessions(n, 0, 4000, 10)
    print(f"part 1: normalise a ~4k-token system prompt + 10 tools, {n} distinct prompts")
    print(f"{'mode':<12} {'median ms':>10} {'p99 ms':>8}")
    for mode in TemplateMode:
        t = Templater(mode)
        t.normalize(*sessions[0][:2])  # warm the tokeniser and the token-length cache
        times = []
        for msgs, tls, _ in sessions:
            t0 = time.perf_counter()
            t.normalize(msgs, tls)
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"{mode.value:<12} {statistics.median(times):>10.3f} {percentile(times, 0.99):>8.3f}")
    print("same prompt again (later calls of a session):")
    for mode in TemplateMode:
        t = Templater(mode)
        msgs, tls, _ = sessions[0]
        t.normalize(msgs, tls)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            t.normalize(msgs, tls)
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"{mode.value:<12} {statistics.median(times):>10.3f} {percentile(times, 0.99):>8.3f}")


def _conversation(msgs: list[dict[str, Any]], steps: int, rng: random.Random) -> list[dict[str, Any]]:
    """``msgs`` and ``steps`` ReAct steps after it: a tool call, then its result (about 150 tokens)."""
    out = list(msgs)
    for k in range(steps):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": f"tool_{k % 10}", "arguments": '{"query": "step %d"}' % k}}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{k}",
                    "content": " ".join(rng.choice(_WORDS) for _ in range(120))})
    return out


def conversations(n: int = 30, steps: int = 8) -> None:
    """Each call of a session as a gateway receives it: the whole conversation so far, read from JSON."""
    rng = random.Random(2)
    body, tools = _body(4000, rng), _tools(10, rng)
    sessions = [_session(i, body, tools, rng) for i in range(n)]
    calls = [json.dumps({"messages": _conversation(msgs, k, rng), "tools": tls}).encode()
             for msgs, tls, _ in sessions for k in range(steps + 1)]
    print(f"\n{n} sessions of {steps + 1} calls, the conversation growing by a tool call and its result per "
          "call; each call read from JSON (as the gateway reads it)")
    print(f"{'mode':<12} {'median ms':>10} {'p99 ms':>8}   parsed_json=True: {'median ms':>10} {'p99 ms':>8}")
    for mode in TemplateMode:
        row = []
        for parsed in (False, True):
            t = Templater(mode)
            times = []
            for raw in calls:
                request = json.loads(raw)
                t0 = time.perf_counter()
                t.normalize(request["messages"], request["tools"], session_id="s", parsed_json=parsed)
                times.append((time.perf_counter() - t0) * 1e3)
            row.append(f"{statistics.median(times):>10.3f} {percentile(times, 0.99):>8.3f}")
        print(f"{mode.value:<12} {row[0]}   {'':>17} {row[1]}")


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def sharing(n: int = 200) -> None:
    sessions = _sessions(n, 1, 1500, 8)
    print(f"\npart 2: {n} sessions of one agent (timestamp, user name, request id at the top; 8 tools, shuffled)")
    print(f"{'mode':<32} {'mean shared prefix tokens':>26} {'prompt tokens':>14} {'template ids':>13}")
    rows = [("off", TemplateMode.OFF, False), ("canonical", TemplateMode.CANONICAL, False),
            ("templatize", TemplateMode.TEMPLATIZE, False),
            ("templatize + user_name variable", TemplateMode.TEMPLATIZE, True)]
    for label, mode, use_var in rows:
        t = Templater(mode)
        toks, ids = [], set()
        for msgs, tls, name in sessions:
            p = t.normalize(msgs, tls, variables={"user_name": name} if use_var else None)
            ids.add(p.template_id)
            toks.append(encoder().encode(render_chat(p.messages, p.tools)[0], disallowed_special=()))
        shared = [_common(toks[0], x) for x in toks[1:]]
        print(f"{label:<32} {statistics.mean(shared):>26.1f} {statistics.mean(map(len, toks)):>14.1f} {len(ids):>13}")


def main() -> None:
    latency()
    conversations()
    sharing()


if __name__ == "__main__":
    main()
