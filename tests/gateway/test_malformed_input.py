"""Malformed input of every kind through the real gateway (keys, admin endpoints, two workers):
never a 5xx, never a worker taken out of rotation, and the admin view keeps answering."""

from __future__ import annotations

import json
from typing import Any, Iterator
from urllib.parse import quote

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

USER = {"authorization": "Bearer sk-user", "content-type": "application/json"}
ADMIN = {"authorization": "Bearer sk-admin", "content-type": "application/json"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
# values of every JSON type, edge numbers, lone surrogates (valid JSON escapes, not valid UTF-8)
BAD: list[Any] = [None, True, 0, -1, 1.5, 1e308, 2**70, "", "x", "\ud800", "\x00", [], [None], [1, "a"], {},
                  {"a": None}, {"\ud800": 1}, {"k": "\udc00"}, [[[]]]]
CHAT_FIELDS = ["model", "messages", "tools", "tool_choice", "stream", "stream_options", "response_format",
               "logprobs", "top_logprobs", "logit_bias", "seed", "temperature", "top_p", "top_k", "max_tokens",
               "n", "stop", "user", "chat_template_kwargs", "custom_params", "stop_token_ids", "session_params",
               "rid", "continue_final_message", "\udc00x", "unknown_field"]
GENERATE_FIELDS = ["text", "input_ids", "sampling_params", "stream", "return_logprob", "rid", "custom_labels",
                   "session_params", "routing_key", "image_data"]


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode()  # ASCII: a lone surrogate travels as its escape, as JSON allows


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[str]:
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text("sk-user team-u\nsk-admin ops role=admin\n")
    with SimFleet(2) as fleet, Processes() as procs:
        yield AgentCacheGateways(procs, fleet.urls, args=["--api-keys", str(keys)]).urls[0]


def _sweep(client: httpx.Client, gateway: str, path: str, bodies: list[Any], headers: dict[str, str]) -> list[str]:
    """The bodies answered 5xx (or not at all), each with its answer."""
    failed = []
    for body in bodies:
        try:
            r = client.post(gateway + path, content=body if isinstance(body, bytes) else _raw(body), headers=headers)
        except httpx.HTTPError as exc:
            failed.append(f"{path} {body!r:.200}: {exc!r}")
            continue
        if r.status_code >= 500:
            failed.append(f"{path} {body!r:.200}: {r.status_code} {r.text[:200]}")
        elif r.status_code >= 400:
            error = r.json()["error"]
            assert isinstance(error["message"], str) and error["type"], r.text
    return failed


@pytest.mark.slow
def test_no_malformed_request_gets_a_5xx_or_costs_a_worker(gateway):
    bodies: dict[str, list[Any]] = {
        "/v1/chat/completions": [{**CHAT, field: value, "stream": stream} for field in CHAT_FIELDS for value in BAD
                                 for stream in (False, True) if field != "stream"]
        + [{**CHAT, "messages": [{"role": "user", "content": value}]} for value in BAD]
        + [{**CHAT, "messages": [{"role": value, "content": "x"}]} for value in BAD]
        + [{**CHAT, "messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": value, "arguments": "{}"}}]}]} for value in BAD]
        + [{**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": value}}],
            "tool_choice": choice} for value in BAD for choice in ("auto", {"type": "function", "function": {"name": "g"}})],
        "/v1/completions": [{"model": "m", "prompt": "x", "max_tokens": 3, field: value}
                            for field in ("prompt", "suffix", "echo", "logprobs", "stop", "stream", "logit_bias",
                                          "custom_params", "\udc00x") for value in BAD],
        "/generate": [{"text": "x", "sampling_params": {"max_new_tokens": 3}, field: value}
                      for field in GENERATE_FIELDS for value in BAD]
        + [{field: value} for field in GENERATE_FIELDS for value in BAD]
        + [{"text": "x", "sampling_params": {option: value}} for option in
           ("max_new_tokens", "temperature", "stop", "json_schema", "custom_params") for value in BAD],
    }
    raw = [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe", b'{"a":NaN}', b'{"\\ud800":1}', b"[" * 100_000,
           b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1' + b"0" * 500 + b"}"]
    failed: list[str] = []
    with httpx.Client(timeout=30) as client:
        for path, path_bodies in bodies.items():
            failed += _sweep(client, gateway, path, path_bodies + raw, USER)
        workers = client.get(gateway + "/workers", headers=ADMIN).json()
    assert not failed, f"{len(failed)} answered 5xx or not at all:\n" + "\n".join(failed[:20])
    # none of it was the workers' fault: both still healthy
    assert workers["stats"]["healthy_workers"] == 2 and workers["total"] == 2, workers


@pytest.mark.parametrize("field", ["\udc00x", "logit_bias", "custom_labels"])
def test_an_error_quoting_a_lone_surrogate_is_still_sent(gateway, field):
    body = {"text": "x", field: {"\ud800": "v"}} if field == "custom_labels" else {**CHAT, field: {"\ud800": "x"}}
    r = httpx.post(gateway + ("/generate" if field == "custom_labels" else "/v1/chat/completions"),
                   content=_raw(body), headers=USER, timeout=30)
    assert r.status_code == 400, r.text
    # the field named as UTF-8 can carry it: the lone surrogate written out as its escape
    assert r.json()["error"]["param"].startswith(field.encode("utf-8", "backslashreplace").decode()), r.text


@pytest.mark.parametrize("url", ["http://[::1", "http://\ud800", "http://bücher.example:8000", "http://" + "h" * 3000,
                                 "http://x:99999", "ftp://x", "http://x/?q=1", 5, None, ""])
def test_bad_worker_urls_are_refused_and_the_fleet_view_keeps_answering(gateway, url):
    with httpx.Client(timeout=30) as client:
        r = client.post(gateway + "/workers", content=_raw({"url": url}), headers=ADMIN)
        assert r.status_code == 400, r.text
        if isinstance(url, str) and url:
            encoded = quote(url.encode("utf-8", "surrogatepass"), safe="")
            gone = client.delete(gateway + "/workers/" + encoded, headers=ADMIN)
            assert gone.status_code in (400, 404), gone.text
        listing = client.get(gateway + "/workers", headers=ADMIN)
    assert listing.status_code == 200 and listing.json()["total"] == 2, listing.text


def test_errors_quote_the_request_bounded(gateway):
    """A megabyte-long value or name in a refused request is not sent back whole."""
    huge = "r" * 1_000_000
    bodies = [{**CHAT, "messages": [{"role": huge, "content": "x"}]}, {**CHAT, huge: 1},
              {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": {"type": "function", "function": {"name": huge}}}]
    with httpx.Client(timeout=30) as client:
        for body in bodies:
            r = client.post(gateway + "/v1/chat/completions", content=_raw(body), headers=USER)
            assert 400 <= r.status_code < 500 and len(r.content) < 5000, (r.status_code, len(r.content))
        r = client.delete(gateway + "/workers/" + quote("http://x:1/" + "p" * 10_000, safe=""), headers=ADMIN)
        assert r.status_code in (400, 404) and len(r.content) < 5000, (r.status_code, len(r.content))


def test_admin_body_nested_past_the_parser_is_a_400(gateway):
    r = httpx.post(gateway + "/workers", content=b"[" * 60_000, headers=ADMIN, timeout=30)
    assert r.status_code == 400, r.text
