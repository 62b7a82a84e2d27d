"""Wrong-typed and deeply nested fields through the real gateway: a 400 naming the field, never a 5xx."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

MSG = [{"role": "user", "content": "x"}]
CHAT = {"model": "m", "messages": MSG, "max_tokens": 4}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _deep(levels: int) -> str:
    """A placeholder for JSON nested ``levels`` deep (the client's encoder would recurse on the real thing)."""
    return f"@@deep{levels}@@"


def _nested(levels: int) -> str:
    opens = "".join("[" if i % 2 else '{"a":' for i in range(levels))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(levels)))
    return opens + "1" + closes


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    text = re.sub(r'"@@deep(\d+)@@"', lambda m: _nested(int(m.group(1))), json.dumps(body))
    return httpx.post(url, content=text, headers={"content-type": "application/json"}, timeout=30)


# (body changes, the field the 400 must name)
CHAT_CASES: list[tuple[dict[str, Any], str]] = [
    ({"tools": 5}, "tools"), ({"tools": True}, "tools"), ({"tools": "zz"}, "tools"),
    ({"tools": [5]}, "tools[0]"), ({"tools": [{"type": "function", "function": {"name": 3}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [TOOL], "tool_choice": 7}, "tool_choice"), ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": 5}}}, "tool_choice.function.name"),
    ({"stream": "false"}, "stream"), ({"stream": 0}, "stream"), ({"stream": [True]}, "stream"),
    ({"model": 5}, "model"), ({"model": ["m"]}, "model"),
    ({"response_format": "json"}, "response_format"), ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": 3}}},
     "response_format.json_schema.schema"),
    ({"logprobs": 3}, "logprobs"), ({"logprobs": "yes"}, "logprobs"), ({"top_logprobs": 1.5}, "top_logprobs"),
    ({"logit_bias": [1, 2]}, "logit_bias"), ({"logit_bias": {"50": "high"}}, "logit_bias.50"),
    ({"priority": "high"}, "priority"), ({"priority": 1.5}, "priority"), ({"seed": "1"}, "seed"),
    ({"temperature": "hot"}, "temperature"), ({"max_tokens": True}, "max_tokens"), ({"n": []}, "n"),
    ({"stop": 5}, "stop"), ({"stop": ["a", 5]}, "stop[1]"), ({"stream_options": {"include_usage": "yes"}},
                                                           "stream_options.include_usage"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"), ({"custom_params": "x"}, "custom_params"),
    ({"reasoning_effort": "max"}, "reasoning_effort"), ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ({"stop_token_ids": ["1"]}, "stop_token_ids[0]"), ({"lora_path": 5}, "lora_path"),
    ({"parallel_tool_calls": "true"}, "parallel_tool_calls"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": 3}]}, "messages[0].tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _deep(1000)}}]}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": _deep(1000)}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "deep": _deep(1000)}]}]}, "messages"),
    ({"custom_params": _deep(1000)}, "custom_params"), ({"custom_params": _deep(100)}, "custom_params"),
    ({"chat_template_kwargs": _deep(900)}, "chat_template_kwargs"),
]
OTHER_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {"prompt": "x", "stream": "false"}, "stream"),
    ("/v1/completions", {"prompt": 5}, "prompt"), ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "echo": "no"}, "echo"),
    ("/v1/completions", {"prompt": "x", "custom_params": _deep(1000)}, "custom_params"),
    ("/v1/completions", {"prompt": None}, "prompt"), ("/v1/completions", {"prompt": []}, "prompt"),
    ("/generate", {"text": None}, "text"), ("/generate", {"text": ""}, "text"), ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"text": "x", "stream": "true"}, "stream"), ("/generate", {"text": 5}, "text"),
    ("/generate", {"text": "x", "sampling_params": 3}, "sampling_params"),
    ("/generate", {"input_ids": ["a"]}, "input_ids[0]"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "5"}}, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ("/generate", {"text": ["x", "y"], "sampling_params": [{"top_p": 0.5}, {"ignore_eos": "yes"}]},
     "sampling_params[1].ignore_eos"),
    ("/generate", {"text": "x", "sampling_params": _deep(1000)}, "sampling_params"),
]


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with SimFleet(1) as fleet, Processes() as procs:
        yield AgentCacheGateways(procs, fleet.urls).urls[0]


@pytest.mark.parametrize("change,field", CHAT_CASES, ids=[f for _, f in CHAT_CASES])
def test_wrong_chat_fields_get_400_naming_them(gateway, change, field):
    r = _post(gateway + "/v1/chat/completions", {**CHAT, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error", error


@pytest.mark.parametrize("path,body,field", OTHER_CASES, ids=[f"{p}:{f}" for p, _, f in OTHER_CASES])
def test_wrong_fields_of_other_routes_get_400(gateway, path, body, field):
    r = _post(gateway + path, {"max_tokens": 4, **body} if path != "/generate" else body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_well_typed_requests_still_pass(gateway):
    good = [{**CHAT, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}},
             "stream": False, "logprobs": False, "logit_bias": {"50": -1}, "priority": 0,
             "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": _deep(60)}}},
            {**CHAT, "stream": True, "stop": ["x"], "custom_params": {"k": [1, {"a": None}]}}]
    for body in good:
        r = _post(gateway + "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
    assert httpx.post(gateway + "/v1/completions", json={"prompt": "x", "max_tokens": 4, "logprobs": 1},
                      timeout=30).status_code == 200
    assert httpx.post(gateway + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4}},
                      timeout=30).status_code == 200
    assert httpx.get(gateway + "/health").json()["inflight"] == 0
